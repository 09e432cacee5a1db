"""`dualpath demo`'s twin column: the simulator's prediction beside each row (quick calibration, cached per
cluster)."""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dualpath.runtime.bench import BenchOptions
from dualpath.twin.calibration import Calibration

# The cache was measured at the host's speed of its day; when the twin's speed probe (`twin.host_load`) now
# reads this much faster or slower, it is measured again. Chosen above the probe's own spread: fifteen
# `host_probe_cpu_s` readings within 15 s on an idle host (2026-12-03) spanned 0.69-0.88 ms (27 %), while the
# host's two vCPU speeds are 1.7x apart (docs/twin.md "The host's speed").
PROBE_TOLERANCE = 0.3
_PROBE_SAMPLES, _PROBE_GAP_S = 20, 0.05  # ≈ 1 s: the vCPUs switch speed within seconds


def host_probe_cpu_s() -> float:
    """The twin's speed probe: the median of `_PROBE_SAMPLES` means of five runs, `_PROBE_GAP_S` apart."""
    from dualpath.twin.host_load import speed_probe_cpu_s

    samples = []
    for _ in range(_PROBE_SAMPLES):
        samples.append(statistics.mean(speed_probe_cpu_s() for _ in range(5)))
        time.sleep(_PROBE_GAP_S)
    return statistics.median(samples)


def cached_calibration(
    config: str,
    *,
    folder: Path | None = None,
    say: Callable[[str], None] = print,
    probe: Callable[[], float] = host_probe_cpu_s,
) -> Calibration:
    """A quick calibration of this machine for `config`, measured once and cached in the temp folder with the
    host's load and speed probe it was measured under; measured again when the probe now disagrees."""
    from dualpath.runtime.cluster import load_cluster
    from dualpath.twin.calibrate import calibrate
    from dualpath.twin.calibration import CalibrationError, load_calibration, write_calibration

    spec = load_cluster(config)
    folder = folder or Path(tempfile.gettempdir()) / "dualpath-demo"
    path = folder / f"calibration-{spec.name}.toml"
    probe_now = probe()
    why = "none cached"
    if path.is_file():
        try:
            cached = load_calibration(path)
            then = float(cached.meta.get("probe_cpu_s", 0.0))
            # A cache written before the in-situ factors, the PE's stall or the recorded probe: measure again.
            if not (
                cached.runtime_cpu and all("pe_stall_s" in f for f in cached.runtime_cpu.values()) and then
            ):
                why = "an older cache"
            elif abs(probe_now / then - 1.0) > PROBE_TOLERANCE:
                why = (
                    f"the host's speed probe reads {1e3 * probe_now:.3f} ms, {1e3 * then:.3f} ms when cached"
                )
            else:
                return cached
        except CalibrationError:
            why = "an unreadable cache"
    say(f"[twin] calibrating {spec.name} (quick, cached in {path}; {why}) ...")
    load_before = os.getloadavg()
    cal = calibrate(spec, quick=True, threads=1)
    meta = {"probe_cpu_s": (probe_now + probe()) / 2, "load_average_1m": [load_before[0], os.getloadavg()[0]]}
    cal = dataclasses.replace(cal, meta={**cal.meta, **meta})
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
