"""The human-readable table `dualpath calibrate` prints: fitted numbers, then how well each form fits."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dualpath.twin.calibration import Calibration


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
