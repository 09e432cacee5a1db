"""`dualpath demo`'s twin column: the simulator's prediction beside each row (quick calibration, cached per
cluster)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dualpath.runtime.bench import BenchOptions
from dualpath.twin.calibration import Calibration


def cached_calibration(
    config: str, *, folder: Path | None = None, say: Callable[[str], None] = print
) -> Calibration:
    """A quick calibration of this machine for `config`, measured once and cached in the temp folder."""
    from dualpath.runtime.cluster import load_cluster
    from dualpath.twin.calibrate import calibrate
    from dualpath.twin.calibration import CalibrationError, load_calibration, write_calibration

    spec = load_cluster(config)
    folder = folder or Path(tempfile.gettempdir()) / "dualpath-demo"
    path = folder / f"calibration-{spec.name}.toml"
    if path.is_file():
        try:
            cached = load_calibration(path)
            # A cache written before the in-situ factors, or before the PE's stall: measure again.
            with_stall = all("pe_stall_s" in f for f in cached.runtime_cpu.values())
            if cached.runtime_cpu and with_stall:
                return cached
        except CalibrationError:
            pass  # an old or broken cache: measure again
    say(f"[twin] calibrating {spec.name} (quick, cached in {path}) ...")
    cal = calibrate(spec, quick=True, threads=1)
    folder.mkdir(parents=True, exist_ok=True)
    write_calibration(cal, path)
    return cal


def add_predictions(
    rows: Sequence[dict[str, Any]], cal: Calibration, config: str, options: BenchOptions
) -> None:
    """Adds predicted_jct_s / predicted_ttft_mean_s and their error % to each measured row, in place."""
    from dualpath.runtime.cluster import load_cluster
    from dualpath.twin.predict import predict
    from dualpath.twin.validate import error_pct, trace_rounds

    spec = load_cluster(config)
    trajectories = trace_rounds(options)
    for row in rows:
        predicted, _ = predict(spec, cal, str(row["mode"]), trajectories, aps=options.aps, seed=options.seed,
                               scheduler_rates=row.get("scheduler_rates"))  # fmt: skip
        for key in ("jct_s", "ttft_mean_s"):
            row[f"predicted_{key}"] = predicted[key]
            row[f"{key}_error_pct"] = error_pct(row[key], predicted[key])


def format_predictions(rows: Sequence[dict[str, Any]]) -> str:
    head = f"{'mode':<12}{'JCT s':>8}{'sim JCT':>9}{'err':>7}{'TTFT s':>9}{'sim TTFT':>10}{'err':>7}"
    lines = ["simulator prediction (calibrated twin, same trace):", head, "-" * len(head)]
    for row in rows:
        lines.append(
            f"{row['mode']:<12}{row['jct_s']:>8.2f}{row['predicted_jct_s']:>9.2f}{_pct(row['jct_s_error_pct'])}"
            f"{row['ttft_mean_s']:>9.3f}{row['predicted_ttft_mean_s']:>10.3f}{_pct(row['ttft_mean_s_error_pct'])}"
        )
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return f"{'-':>7}" if value is None else f"{value:>6.0f}%"
