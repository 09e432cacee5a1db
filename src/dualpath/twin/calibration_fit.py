"""Fit calibration measurements to the simulator's own cost-model forms (non-negative least squares).

NOTE: no separate CPU simulator. Every feature is read off `dualpath.sim.cost.CostModel` itself by
evaluating it with probe coefficients (one rate 1, every other rate huge), so the fitted numbers mean
exactly what the simulator does with them (the forms: docs/twin.md "How it is fitted"). α, the fixed
cost of one sequence's attention call, is the CPU analogue of a kernel-launch floor. Rows are weighted
by 1 / measured time: the fit minimises relative error, the quantity the fit report gives.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from dualpath.architecture import arch
from dualpath.config.specs import ModelSpec
from dualpath.sim.cost import DECODE_CONTEXT_BUCKET_TOKENS, CostCoefficients, CostModel
from dualpath.sim.cost_kernels import Curve

# A rate so large that its term vanishes next to any measured time (probe coefficients only).
_HUGE_RATE = 1e30
# The fitted floor never lets a rate become infinite: a coefficient NNLS sets to 0 becomes this rate.
_MAX_RATE = 1e18
# Decode-attention curve sampling: quarter octaves of context (log2-linear interpolation between them
# is within ~0.5 % of the fitted α + β·FLOPs form).
_CURVE_STEPS_PER_OCTAVE = 4
# Floor-binding refits of the prefill layer (max(compute, weight read) is piecewise linear).
_FLOOR_ITERATIONS = 4


@dataclass(frozen=True, kw_only=True)
class FitQuality:
    """How well a fitted form reproduces the points it was fitted to (relative errors)."""

    points: int
    max_rel_error: float
    mean_rel_error: float

    def to_dict(self) -> dict[str, float]:
        return {
            "points": self.points,
            "max_rel_error": self.max_rel_error,
            "mean_rel_error": self.mean_rel_error,
        }

    @staticmethod
    def from_dict(d: dict[str, float]) -> FitQuality:
        return FitQuality(
            points=int(d["points"]),
            max_rel_error=float(d["max_rel_error"]),
            mean_rel_error=float(d["mean_rel_error"]),
        )


@dataclass(frozen=True, kw_only=True)
class PrefillPoint:
    cached_tokens: int
    new_tokens: int
    time_s: float  # one `prefill_layer` call


@dataclass(frozen=True, kw_only=True)
class DecodePoint:
    batch_size: int
    context_tokens: int  # per sequence
    time_s: float  # one `decode_step` of the whole batch


def columns(cls: type, rows: Sequence[Any]) -> dict[str, list[Any]]:
    """Points (`PrefillPoint`, `DecodePoint`) as a [measurements] table: one list per field."""
    return {f.name: [getattr(row, f.name) for row in rows] for f in fields(cls)}


def points(cls: type, table: Mapping[str, Sequence[float]]) -> list[Any]:
    """A [measurements] table back into points: token counts as ints, `time_s` as a float."""
    names = [f.name for f in fields(cls)]
    return [
        cls(**{n: float(v) if n == "time_s" else int(v) for n, v in zip(names, row, strict=True)})
        for row in zip(*(table[n] for n in names), strict=True)
    ]


@dataclass(frozen=True, kw_only=True)
class LineFit:
    """time = fixed_s + size / rate_per_s (a transfer, a storage op)."""

    fixed_s: float
    rate_per_s: float
    quality: FitQuality


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ‖a·x − b‖ subject to x ≥ 0 (Lawson & Hanson 1974, active set). scipy is not a dependency."""
    rows, cols = a.shape
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale  # unit columns: the tolerances below are then scale-free
    x = np.zeros(cols)
    passive = np.zeros(cols, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max()) * float(np.abs(b).max()))
    for _ in range(3 * cols + 3):
        gradient = a.T @ (b - a @ x)
        candidates = np.where(~passive, gradient, -np.inf)
        if passive.all() or candidates.max() <= tol:
            break
        passive[int(np.argmax(candidates))] = True
        while True:
            z = np.zeros(cols)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            blocking = passive & (z <= 0)
            step = float(np.min(x[blocking] / (x[blocking] - z[blocking])))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    result: np.ndarray = x / scale
    return result


def quality(predicted: Sequence[float], measured: Sequence[float]) -> FitQuality:
    errors = [abs(p - m) / m for p, m in zip(predicted, measured, strict=True) if m > 0]
    if not errors:
        return FitQuality(points=0, max_rel_error=0.0, mean_rel_error=0.0)
    return FitQuality(
        points=len(errors), max_rel_error=float(max(errors)), mean_rel_error=float(sum(errors) / len(errors))
    )


def fit_line(sizes: Sequence[float], times_s: Sequence[float]) -> LineFit:
    """Per-op fixed time and achieved rate from (size, time) samples, both non-negative.

    Fitted to the median time of each size (a thread woken late on a busy host is one slow sample,
    not a slower link), and judged against those medians, as the model points are.
    """
    by_size: dict[float, list[float]] = {}
    for size, time_s in zip(sizes, times_s, strict=True):
        by_size.setdefault(float(size), []).append(float(time_s))
    x = np.array(sorted(by_size))
    y = np.array([statistics.median(by_size[s]) for s in x])
    a = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    fixed_s, seconds_per_unit = nnls(a, np.ones_like(y))
    rate = _rate(float(seconds_per_unit))
    predicted = [fixed_s + s / rate for s in x]
    return LineFit(fixed_s=float(fixed_s), rate_per_s=float(rate), quality=quality(predicted, list(y)))


# ---- the cost model's forms ----------------------------------------------------------------------


def _probe(model: ModelSpec, **rates: float) -> CostModel:
    """A cost model where only the named rates are finite: its times are that term's own feature."""
    values = {
        "bf16_flops_per_s": _HUGE_RATE,
        "linear_flops_per_s": _HUGE_RATE,
        "fp8_flops_per_s": _HUGE_RATE,
        "weight_read_bytes_per_s": _HUGE_RATE,
    }
    values.update(rates)
    curve = Curve.constant(1.0)
    return CostModel(model, CostCoefficients(**values, decode_attention={1: curve}))  # type: ignore[arg-type]


def _rate(seconds_per_unit: float) -> float:
    return float(1.0 / seconds_per_unit) if seconds_per_unit > 0 else _MAX_RATE


def fit_prefill(
    model: ModelSpec, points: Sequence[PrefillPoint], *, weight_read_bytes_per_s: float
) -> CostCoefficients:
    """bf16 (attention), linear rates and layer_overhead_s from `prefill_layer` timings."""
    batches = [[(p.cached_tokens, p.new_tokens)] for p in points]
    attention = np.array([_probe(model, bf16_flops_per_s=1.0).prefill_layer_time_s([b]) for b in batches])
    linear = np.array([_probe(model, linear_flops_per_s=1.0).prefill_layer_time_s([b]) for b in batches])
    reading = _probe(model, weight_read_bytes_per_s=weight_read_bytes_per_s)
    floor_s = np.array([reading.prefill_layer_time_s([b]) for b in batches])
    y = np.array([p.time_s for p in points])
    binds = np.zeros(len(points), dtype=bool)
    solution = np.zeros(3)
    for _ in range(_FLOOR_ITERATIONS):
        # Where the weight read floor binds, the linear term is the (known) floor, not a FLOP count.
        features = np.stack([attention, np.where(binds, 0.0, linear), np.ones_like(y)], axis=1)
        target = y - np.where(binds, floor_s, 0.0)
        solution = nnls(features / y[:, None], target / y)
        new_binds = floor_s > solution[1] * linear
        if (new_binds == binds).all():
            break
        binds = new_binds
    seconds_per_attention_flop, seconds_per_linear_flop, overhead_s = (float(v) for v in solution)
    linear_rate = _rate(seconds_per_linear_flop)
    return CostCoefficients(
        bf16_flops_per_s=_rate(seconds_per_attention_flop),
        linear_flops_per_s=linear_rate,
        fp8_flops_per_s=linear_rate,  # no FP8 on the CPU; only DSA's indexer would use it
        weight_read_bytes_per_s=weight_read_bytes_per_s,
        layer_overhead_s=float(overhead_s),
    )


def fit_decode(
    model: ModelSpec, points: Sequence[DecodePoint], prefill: CostCoefficients
) -> tuple[CostCoefficients, dict[str, float]]:
    """α, β_B (one decode-attention curve per measured batch size, the surface's form) and
    step_overhead_s, with the prefill-fitted terms held fixed.

    β differs by batch because the per-pair cost grows with the batch on a CPU (B contexts are gathered
    from the paged cache each step, so a large B·C leaves the caches), as the GPU surface
    `decode_attention[batch]` also differs by batch. α is shared: a per-batch α would be a per-batch
    constant, indistinguishable from step_overhead_s.
    """
    flat = {1: Curve.constant(_HUGE_RATE)}  # attention vanishes: what is left is linear + overheads
    base_model = CostModel(model, replace(prefill, decode_attention=flat, step_overhead_s=0.0))
    per_pair = _probe(model, bf16_flops_per_s=1.0)
    y = np.array([p.time_s for p in points])
    base = np.array(
        [base_model.decode_step_time_s(p.batch_size, p.batch_size * p.context_tokens) for p in points]
    )
    attention_flops = np.array(
        [per_pair.decode_step_time_s(p.batch_size, p.batch_size * p.context_tokens) for p in points]
    )
    calls = np.array([float(model.num_layers * p.batch_size) for p in points])
    batch = np.array([p.batch_size for p in points])
    sizes = sorted(set(batch.tolist()))
    columns = [np.where(batch == b, attention_flops, 0.0) for b in sizes]
    features = np.stack([calls, *columns, np.ones_like(y)], axis=1)
    solution = nnls(features / y[:, None], (y - base) / y)
    alpha_s = float(solution[0])
    surface: dict[int, Curve] = {}
    parameters = {"decode_attention_per_sequence_s": alpha_s}  # α: one sequence, one layer
    for i, b in enumerate(sizes):
        beta_s_per_flop = float(solution[1 + i])
        surface[int(b)] = decode_attention_curve(
            model, prefill.bf16_flops_per_s, per_sequence_s=alpha_s, seconds_per_flop=beta_s_per_flop
        )
        parameters[f"decode_b{b}_attention_flops_per_s"] = _rate(beta_s_per_flop)  # 1 / β_B
    coefficients = replace(prefill, decode_attention=surface, step_overhead_s=float(solution[-1]))
    return coefficients, parameters


def decode_attention_curve(
    model: ModelSpec, bf16_flops_per_s: float, *, per_sequence_s: float, seconds_per_flop: float
) -> Curve:
    """The efficiency curve that makes one sequence's attention take α + β·FLOPs(C) on one layer."""
    bucket = DECODE_CONTEXT_BUCKET_TOKENS
    octaves = max(1.0, math.log2(max(model.max_context_tokens, 2 * bucket) / bucket))
    steps = math.ceil(octaves * _CURVE_STEPS_PER_OCTAVE)
    sizes, values = [], []
    for k in range(steps + 1):
        context = bucket * 2.0 ** (k / _CURVE_STEPS_PER_OCTAVE)
        flops = arch.decode_attention_flops(model, round(context))
        time_s = max(per_sequence_s + seconds_per_flop * flops, 1e-300)
        sizes.append(context)
        values.append(max(flops / (bf16_flops_per_s * time_s), 1e-300))
    return Curve(sizes=tuple(sizes), values=tuple(values))


def prefill_quality(cost: CostModel, points: Sequence[PrefillPoint]) -> FitQuality:
    predicted = [cost.prefill_layer_time_s([[(p.cached_tokens, p.new_tokens)]]) for p in points]
    return quality(predicted, [p.time_s for p in points])


def decode_quality(cost: CostModel, points: Sequence[DecodePoint]) -> FitQuality:
    predicted = [cost.decode_step_time_s(p.batch_size, p.batch_size * p.context_tokens) for p in points]
    return quality(predicted, [p.time_s for p in points])


def fit_cost_coefficients(
    model: ModelSpec,
    prefill: Sequence[PrefillPoint],
    decode: Sequence[DecodePoint],
    *,
    weight_read_bytes_per_s: float,
) -> tuple[CostCoefficients, dict[str, FitQuality], dict[str, float]]:
    """The whole compute fit: prefill first (it fixes the rates), then decode on top of it.

    Returns the coefficients, the fit quality per measured kind, and the decode attention parameters."""
    coefficients = fit_prefill(model, prefill, weight_read_bytes_per_s=weight_read_bytes_per_s)
    parameters: dict[str, float] = {}
    if decode:
        coefficients, parameters = fit_decode(model, decode, coefficients)
    cost = CostModel(model, coefficients)
    report = {"prefill_layer": prefill_quality(cost, prefill)}
    if decode:
        report["decode_step"] = decode_quality(cost, decode)
    return coefficients, report, parameters
