"""What the twin's commands print and draw (`calibrate`, `validate`, `demo`): tables and the TTFT plot.

Presentation only: the numbers come from `dualpath.twin` (a `Calibration`, `validate.ModeResult`s, the
demo's rows with their predictions).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dualpath.twin.validate import COMPARED, error_pct

if TYPE_CHECKING:
    from dualpath.twin.calibration import Calibration
    from dualpath.twin.validate import ModeResult


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _rate_or_fixed(bytes_per_s: float) -> str:
    # The fit's ceiling rate (calibration_fit._MAX_RATE) means the time did not grow with the size.
    return "no size term (fixed time per op)" if bytes_per_s >= 1e17 else _si(bytes_per_s, "B/s")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def format_report(calibration: Calibration) -> str:
    c = calibration.cost_model.coefficients
    hw, o, meta = calibration.hardware, calibration.overheads, calibration.meta
    configured = calibration.measurements.get("cluster", {})
    rows = [
        ("attention rate (bf16_flops_per_s)", _si(c.bf16_flops_per_s, "FLOP/s")),
        ("linear rate (linear_flops_per_s)", _si(c.linear_flops_per_s, "FLOP/s")),
        ("weight read (weight_read_bytes_per_s)", _si(c.weight_read_bytes_per_s, "B/s")),
        ("layer_overhead_s", _ms(c.layer_overhead_s)),
        ("step_overhead_s", _ms(c.step_overhead_s)),
    ]
    for name, value in calibration.parameters.items():
        rows.append((name, _si(value, "FLOP/s") if name.endswith("_per_s") else _ms(value)))
    rows += [
        (
            "SNIC achieved (configured)",
            f"{_si(hw.snic_bytes_per_s, 'B/s')} ({_si(configured.get('snic_bytes_per_s', 0), 'B/s')})",
        ),
        (
            "CNIC achieved (configured)",
            f"{_si(hw.cnic_bytes_per_s, 'B/s')} ({_si(configured.get('cnic_bytes_per_s', 0), 'B/s')})",
        ),
        ("DRAM (memcpy, read+write)", _si(hw.dram_bytes_per_s, "B/s")),
        ("FileStore read", _si(hw.storage_bytes_per_s, "B/s")),
        ("FileStore write", _rate_or_fixed(o.store_write_bytes_per_s)),
        ("per transfer: SNIC / CNIC", f"{_ms(o.snic_transfer_s)} / {_ms(o.cnic_transfer_s)}"),
        ("shm write + notice (fixed)", _ms(o.shm_write_s)),
        ("notice / control round trip", f"{_ms(o.notice_round_trip_s)} / {_ms(o.control_round_trip_s)}"),
        ("FileStore op: read / write", f"{_ms(o.store_read_op_s)} / {_ms(o.store_write_op_s)}"),
        ("embedding + LM head per forward", _ms(o.prefill_head_s)),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [
        f"calibration of {meta.get('cluster', '?')} on {meta.get('machine', '?')}: torch threads "
        f"{meta.get('torch_threads', '?')}, {meta.get('duration_s', 0.0):.1f} s{' (quick)' if meta.get('quick') else ''}",
        "",
        f"{'fitted':<{width}}  value",
        *(f"{name:<{width}}  {value}" for name, value in rows),
        "",
        f"{'fit (relative error vs measured)':<{width}}  points  max      mean",
    ]
    for name, q in calibration.fit_report.items():
        lines.append(f"{name:<{width}}  {q.points:>6}  {q.max_rel_error:>6.1%}  {q.mean_rel_error:>6.1%}")
    return "\n".join(lines)


def format_tables(results: dict[str, ModeResult]) -> str:
    head = f"{'mode':<10}{'metric':<18}{'measured':>12}{'predicted':>12}{'error':>9}"
    lines = [head, "-" * len(head)]
    repeats = max((len(r.runs) for r in results.values()), default=1)
    if repeats > 1:
        lines.insert(
            0, f"mean of {repeats} runs per mode (each on a fresh cluster, predicted for its own conditions)"
        )
    for mode, r in results.items():
        errors = r.error_pct()
        for k in COMPARED:
            err = errors[k]
            lines.append(
                f"{mode:<10}{k:<18}{r.measured[k]:>12.3f}{r.predicted[k]:>12.3f}"
                + (f"{err:>8.1f}%" if err is not None else f"{'-':>9}")
            )
        if len(r.runs) > 1:
            jcts = [run["measured"]["jct_s"] for run in r.runs]
            lines.append(f"{mode:<10}{'jct_s runs':<18}" + " ".join(f"{j:.2f}" for j in jcts))
        for node in sorted(r.measured["snic_bytes"]):
            m, p = r.measured["snic_bytes"][node], r.predicted["snic_bytes"].get(node, {})
            for d in ("rx", "tx"):
                e = error_pct(m[d], p.get(d))
                lines.append(
                    f"{mode:<10}{'snic ' + node + ' ' + d + ' MB':<18}{m[d] / 1e6:>12.2f}{p.get(d, 0.0) / 1e6:>12.2f}"
                    + (f"{e:>8.1f}%" if e is not None else f"{'-':>9}")
                )
        for path in ("pe_read", "de_read"):
            m, p = r.measured["read_path_bytes"][path], r.predicted["read_path_bytes"][path]
            e = error_pct(m, p)
            lines.append(
                f"{mode:<10}{path + ' MB':<18}{m / 1e6:>12.2f}{p / 1e6:>12.2f}"
                + (f"{e:>8.1f}%" if e is not None else f"{'-':>9}")
            )
    jm = {m: r.measured["jct_s"] for m, r in results.items()}
    jp = {m: r.predicted["jct_s"] for m, r in results.items()}
    if "basic" in jm and "dualpath" in jm:
        rm, rp = jm["basic"] / jm["dualpath"], jp["basic"] / jp["dualpath"]
        lines.append(
            f"basic/dualpath JCT: measured {rm:.2f}x, predicted {rp:.2f}x ({100 * (rp / rm - 1):+.1f}%)"
        )
    return "\n".join(lines)


def plot_ttft(results: dict[str, ModeResult], path: Path) -> None:
    """Measured (dots) and predicted (line) TTFT against the time each first token came, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(8, 2.6 * len(results)), squeeze=False)
    for ax, (mode, r) in zip(axes[:, 0], results.items(), strict=True):
        for series, style, label in ((r.measured, "o", "measured"), (r.predicted, "-", "predicted")):
            pts = series.get("ttft_series", [])
            ax.plot([t for t, _ in pts], [v for _, v in pts], style, markersize=3, label=label)
        ax.set_title(mode)
        ax.set_ylabel("TTFT s")
        ax.legend(loc="upper right")
    axes[-1, 0].set_xlabel("time of the first token, s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
