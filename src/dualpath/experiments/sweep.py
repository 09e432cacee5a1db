"""Declarative sweeps: a TOML file that names a grid (or list) of `dualpath simulate` runs.

    name = "snic-speed"                       # output folder name and page title
    title = "SNIC speed per node"             # optional
    about = "What the sweep asks."            # optional: a paragraph on the report page
    x = "set.hardware.snic_bytes_per_s"       # optional: the axis on the plots' x (default: first grid axis)
    metrics = ["jct_s", "ttft_s.p90"]         # optional: what to tabulate and plot (dotted: a statistic)

    [base]                                    # every run: any run field below
    model = "ds-27b"
    layout = "1P1D"                           # or p = 1, d = 1
    agents = 512
    set = ["workload.gen_scale=0.5"]          # `--set` overrides of every run

    [grid]                                    # every combination of these values
    mode = ["basic", "dualpath"]
    "set.hardware.snic_bytes_per_s" = ["200Gbps", "400Gbps", "800Gbps"]

    [[runs]]                                  # optional: explicit points, each crossed with the grid
    layout = "2P4D"

Run fields: hardware, model, p, d, layout ("2P4D"), dataset, trace (a shipped trace's name such as
"mooncake-conversation", or a trajectory file or a Mooncake trace relative to the spec file or the working
folder; experiments/traces.py), agents, aps, duration_s, mode, read_path, seed, early_stop_ttft_s,
early_stop_p90_ttft_s, set; and "set.<cluster or workload key>" for one override. Online
runs (aps) need duration_s; their agent count defaults to aps × duration_s. Every run is a `RunSpec`, so
results share `reproduce`'s per-run cache.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath.experiments.runspec import RunSpec

Value = str | int | float

_INT_FIELDS = ("p", "d", "agents", "seed")
_FLOAT_FIELDS = ("aps", "duration_s", "early_stop_ttft_s", "early_stop_p90_ttft_s")
_STR_FIELDS = ("hardware", "model", "dataset", "mode", "read_path")
RUN_FIELDS = (*_STR_FIELDS, *_INT_FIELDS, *_FLOAT_FIELDS, "layout", "trace", "set")
_TOP_KEYS = ("name", "title", "about", "x", "metrics", "base", "grid", "runs")
DEFAULT_METRICS = ("jct_s", "ttft_s.mean", "ttft_s.p90", "tpot_s.mean", "tpot_s.p90", "slo_attainment")
_LAYOUT = re.compile(r"^\s*(\d+)\s*P\s*(\d+)\s*D\s*$", re.IGNORECASE)


class SweepError(ValueError):
    """A bad sweep spec; the message names the key."""


@dataclass(frozen=True, kw_only=True)
class SweepRun:
    values: dict[str, Value]  # the swept axes' values of this run (table columns, plot series)
    spec: RunSpec


@dataclass(frozen=True, kw_only=True)
class Sweep:
    name: str
    title: str
    about: str
    axes: tuple[str, ...]  # names of the axes that vary, in file order (grid first, then runs' keys)
    x: str | None  # the plots' x axis
    metrics: tuple[str, ...]
    runs: tuple[SweepRun, ...] = field(default_factory=tuple)

    def specs(self) -> list[RunSpec]:
        return [run.spec for run in self.runs]


def load_sweep(path: Path, extra_sets: Sequence[str] = (), trace_dir: Path = Path("out/traces")) -> Sweep:
    """Read and expand a sweep spec file; `extra_sets` are `--set` overrides added to every run; Mooncake
    traces are converted to agents in `trace_dir` (experiments/traces.py)."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SweepError(f"{path}: no such sweep spec") from None
    except tomllib.TOMLDecodeError as error:
        raise SweepError(f"{path}: not valid TOML ({error})") from None
    return parse_sweep(raw, where=str(path), folder=path.parent, extra_sets=extra_sets, trace_dir=trace_dir)


def parse_sweep(
    raw: Mapping[str, Any],
    *,
    where: str,
    folder: Path,
    extra_sets: Sequence[str] = (),
    trace_dir: Path = Path("out/traces"),
) -> Sweep:
    for key in raw:
        if key not in _TOP_KEYS:
            raise SweepError(f"{where}: unknown key {key!r}; expected one of {', '.join(_TOP_KEYS)}")
    name = raw.get("name") or Path(where).stem
    base = _table(raw, "base", where)
    grid = _table(raw, "grid", where)
    points = raw.get("runs", [{}])
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points) or not points:
        raise SweepError(f"{where}: 'runs' must be a list of tables ([[runs]])")
    for axis, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}: grid.{axis} must be a non-empty list of values")
    for key, value in [*((f"base.{k}", v) for k, v in base.items()),
                       *((f"grid.{k}", v) for k, vs in grid.items() for v in vs),
                       *((f"runs[{i}].{k}", v) for i, p in enumerate(points) for k, v in p.items())]:  # fmt: skip
        _check_field(key, value, where)
    point_keys = list(dict.fromkeys(k for p in points for k in p))
    axes = tuple(
        a
        for a in dict.fromkeys([*grid, *point_keys])
        if len({_show(v) for v in _axis_values(a, grid, points)}) > 1
    )
    runs = []
    for point in points:
        for combo in itertools.product(*grid.values()):
            fields = {**base, **dict(zip(grid, combo, strict=True)), **point}
            spec = _run_spec(fields, where=where, folder=folder, extra_sets=extra_sets, trace_dir=trace_dir)
            runs.append(SweepRun(values={a: _show(fields[a]) for a in axes if a in fields}, spec=spec))
    metrics = tuple(raw.get("metrics", DEFAULT_METRICS))
    x = raw.get("x") or next((a for a in axes if a != "mode"), None)
    if x is not None and x not in axes:
        raise SweepError(f"{where}: x = {x!r} is not a swept axis; swept: {', '.join(axes) or 'none'}")
    return Sweep(name=str(name), title=str(raw.get("title") or name), about=str(raw.get("about") or ""),
                 axes=axes, x=x, metrics=metrics, runs=tuple(runs))  # fmt: skip


def _table(raw: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise SweepError(f"{where}: {key!r} must be a table ([{key}])")
    return dict(value)


def _axis_values(axis: str, grid: Mapping[str, list], points: Sequence[Mapping[str, Any]]) -> list[Any]:
    if axis in grid:
        return list(grid[axis])
    return [p.get(axis) for p in points]


def _check_field(key: str, value: Any, where: str) -> None:
    """Type-check one run field (`key` is its place in the file, e.g. grid.aps)."""
    name = key.split(".", 1)[1]  # "grid.aps" -> "aps", "base.set.hardware.x" -> "set.hardware.x"
    if _is_set_axis(name):
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise SweepError(f"{where}: {key} must be a string or number, got {value!r}")
        return
    if name not in RUN_FIELDS:
        raise SweepError(
            f"{where}: unknown run field {key!r}; run fields: {', '.join(RUN_FIELDS)}, set.<key>"
        )
    ok = {
        **dict.fromkeys(_INT_FIELDS, isinstance(value, int) and not isinstance(value, bool)),
        **dict.fromkeys(_FLOAT_FIELDS, isinstance(value, int | float) and not isinstance(value, bool)),
        **dict.fromkeys((*_STR_FIELDS, "trace"), isinstance(value, str)),
        "layout": isinstance(value, str) and bool(_LAYOUT.match(value)),
        "set": isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value),
    }[name]
    if not ok:
        want = {"layout": 'a layout like "2P4D"', "set": 'a list of "key=value" strings'}.get(
            name, "an integer" if name in _INT_FIELDS else "a number" if name in _FLOAT_FIELDS else "a string"
        )
        raise SweepError(f"{where}: {key} must be {want}, got {value!r}")


def _is_set_axis(key: str) -> bool:
    return key.startswith("set.") and len(key) > 4


def _trace(name: str, *, where: str, folder: Path, trace_dir: Path) -> Path:
    """A shipped trace's name (workload/shipped.py), else a trace file relative to the spec's folder (else
    the working folder), as a trajectory file."""
    from dualpath.experiments.traces import as_trajectory_file
    from dualpath.workload.errors import TraceFormatError
    from dualpath.workload.shipped import resolve_trace

    try:
        path = resolve_trace(name, folders=(folder,))
    except FileNotFoundError as error:
        raise SweepError(f"{where}: {error}") from None
    try:
        return as_trajectory_file(path, trace_dir)
    except TraceFormatError as error:
        raise SweepError(f"{where}: trace {name!r}: {error}") from None


def _run_spec(
    fields: Mapping[str, Any], *, where: str, folder: Path, extra_sets: Sequence[str], trace_dir: Path
) -> RunSpec:
    from dualpath.engine.modes import MODES

    f = dict(fields)
    if "layout" in f:
        if "p" in f or "d" in f:
            raise SweepError(f"{where}: give either layout or p and d, not both")
        match = _LAYOUT.match(f.pop("layout"))
        assert match is not None  # checked by _check_field
        f["p"], f["d"] = int(match[1]), int(match[2])
    if "trace" in f:
        if "dataset" in f:
            raise SweepError(f"{where}: give either dataset or trace, not both")
        f["dataset"] = str(_trace(f.pop("trace"), where=where, folder=folder, trace_dir=trace_dir))
    for required in ("model", "mode", "p", "d"):
        if required not in f:
            raise SweepError(f"{where}: every run needs {required!r} (in [base], [grid] or [[runs]])")
    if f["mode"] not in MODES:
        raise SweepError(f"{where}: mode {f['mode']!r} is not one of {', '.join(MODES)}")
    if ("aps" in f) != ("duration_s" in f):
        raise SweepError(f"{where}: online runs need both aps and duration_s (got only one)")
    if "aps" in f and "agents" not in f:
        f["agents"] = max(1, round(f["aps"] * f["duration_s"]))
    sets = [*f.pop("set", []), *(f"{k[4:]}={f.pop(k)}" for k in list(f) if _is_set_axis(k)), *extra_sets]
    f = {k: float(v) if k in _FLOAT_FIELDS else v for k, v in f.items()}
    return RunSpec(overrides=tuple(sets), **f)


def _show(value: Any) -> Value:
    """A value as the table and plots show it (layouts and lists as text)."""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return value if isinstance(value, str | int | float) else str(value)


SHIPPED_DIR = Path(__file__).parent / "specs"


def shipped_specs() -> dict[str, Path]:
    """The sweep specs that come with the package (what-if scenarios), by name."""
    return {path.stem: path for path in sorted(SHIPPED_DIR.glob("*.toml"))}
