"""Measured H800 kernel efficiencies (InferSim `bench_data/`, Apache-2.0) as interpolable curves.

Source: `dualpath/data/kernels/` (copied unchanged from alibaba/InferSim; see its README and
LICENSE-APACHE). Each curve maps a shape size to MFU (achieved / peak FLOP/s of the kernel's dtype).
Interpolation is piecewise linear in log2(size) and clamps outside the measured range, so a measured
point returns exactly its measured MFU.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Final, final

from mypy_extensions import i64

# A compiled constant: `math.log2` through the module is two dict lookups per call (three calls per `at`).
_log2: Final = math.log2


@dataclass(frozen=True, kw_only=True)
class Curve:
    """Efficiency as a function of one size; points sorted by size (log2-linear interpolation)."""

    sizes: tuple[float, ...]
    values: tuple[float, ...]
    # log2 of each size, taken once here instead of twice per `at` (the same function of the same
    # floats, so the interpolation is bit-identical); derived, so not compared or shown.
    log2_sizes: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.values):
            raise ValueError("a curve needs matching, non-empty sizes and values")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)) or self.sizes[0] <= 0:
            raise ValueError(f"curve sizes must be positive and strictly increasing: {self.sizes}")
        if any(v <= 0 for v in self.values):
            raise ValueError(f"curve values must be positive: {self.values}")
        object.__setattr__(self, "log2_sizes", tuple(_log2(s) for s in self.sizes))

    @staticmethod
    def constant(value: float) -> Curve:
        return Curve(sizes=(1.0,), values=(value,))

    @staticmethod
    def from_points(points: Iterable[tuple[float, float]]) -> Curve:
        """Sort by size; sizes measured more than once take the mean of their values."""
        grouped: dict[float, list[float]] = defaultdict(list)
        for size, value in points:
            grouped[float(size)].append(float(value))
        sizes = sorted(grouped)
        return Curve(sizes=tuple(sizes), values=tuple(statistics.fmean(grouped[s]) for s in sizes))

    def at(self, size: float) -> float:
        sizes, values = self.sizes, self.values
        if size <= sizes[0]:
            return values[0]
        if size >= sizes[-1]:
            return values[-1]
        lo = self.segment(size)
        hi = lo + 1
        log2_sizes = self.log2_sizes
        x0, x1 = log2_sizes[lo], log2_sizes[hi]
        w = (_log2(size) - x0) / (x1 - x0)
        return values[lo] + w * (values[hi] - values[lo])

    def segment(self, size: float) -> i64:
        """The `lo` with `sizes[lo] <= size < sizes[lo + 1]`, for a size strictly inside the range."""
        sizes = self.sizes
        lo: i64 = 0  # native ints: the bisection's index arithmetic in plain C
        hi: i64 = len(sizes) - 1
        while hi - lo > 1:  # bisection: curves have tens of points
            mid = (lo + hi) // 2
            if sizes[mid] <= size:
                lo = mid
            else:
                hi = mid
        return lo

    def to_dict(self) -> dict[str, list[float]]:
        return {"sizes": list(self.sizes), "values": list(self.values)}

    @staticmethod
    def from_dict(d: dict[str, Sequence[float]]) -> Curve:
        return Curve(sizes=tuple(float(x) for x in d["sizes"]), values=tuple(float(y) for y in d["values"]))


@final
class CurveCursor:
    """`Curve.at` for a hot caller: the segment the last size fell in is tried first.

    NOTE: a cost model asks one curve for sizes close to each other again and again (a step's attention
    context, its tokens per GPU). `Curve.at` reads its points from tuples, each a boxed float, ≈ 10 per
    call with its bisection. The cursor keeps the range's ends and the last segment's two points in
    fields of its own (unboxed in the compiled build), so a size in that segment reads no tuple. The
    segment of a size is the unique `lo` with `sizes[lo] <= size < sizes[lo + 1]`, the one the
    bisection finds, and the interpolation is the same expression on the same floats: results are
    bit-identical to `Curve.at`. One cursor per caller (it is state).
    """

    __slots__ = (
        "curve",
        "_first_size",
        "_first_value",
        "_last_size",
        "_last_value",
        "_s0",
        "_s1",
        "_x0",
        "_x1",
        "_v0",
        "_v1",
    )

    def __init__(self, curve: Curve) -> None:
        self.curve = curve
        self._first_size = curve.sizes[0]
        self._first_value = curve.values[0]
        self._last_size = curve.sizes[-1]
        self._last_value = curve.values[-1]
        # The last segment: sizes, log2 sizes and values at its two ends (none yet: an empty range).
        self._s0 = self._s1 = 0.0
        self._x0 = self._x1 = self._v0 = self._v1 = 0.0

    def at(self, size: float) -> float:
        if size <= self._first_size:
            return self._first_value
        if size >= self._last_size:
            return self._last_value
        if not self._s0 <= size < self._s1:  # another segment: `Curve.segment`'s bisection
            self._find(size)
        x0 = self._x0
        w = (_log2(size) - x0) / (self._x1 - x0)
        v0 = self._v0
        return v0 + w * (self._v1 - v0)

    def _find(self, size: float) -> None:
        curve = self.curve
        sizes = curve.sizes
        lo = curve.segment(size)
        hi = lo + 1
        self._s0, self._s1 = sizes[lo], sizes[hi]
        self._x0, self._x1 = curve.log2_sizes[lo], curve.log2_sizes[hi]
        self._v0, self._v1 = curve.values[lo], curve.values[hi]


def _rows(relative_path: str) -> list[dict[str, str]]:
    path = resources.files("dualpath").joinpath("data", "kernels", *relative_path.split("/"))
    with path.open("r", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def gemm_mfu_by_tokens() -> Curve:
    """DeepGEMM FP8 dense GEMM: MFU vs m (tokens), median over the measured (k, n) shapes.

    The median stands for "a typical projection": the measured shapes are DeepSeek-V3's own
    projections (7168×{576, 1536, 2048, 4096, 18432, 36864, …}).
    """
    return _from_points_median((float(r["m"]), float(r["mfu"])) for r in _rows("gemm/h800/data.csv"))


def moe_prefill_mfu_by_tokens_per_expert() -> Curve:
    """DeepGEMM grouped GEMM (contiguous layout, prefill): MFU of up+down vs tokens per expert.

    up (gate+up, 2·I wide) has twice the FLOPs of down, so the combined MFU is their FLOP-weighted
    harmonic mean 3 / (2/up + 1/down).
    """
    points = []
    for r in _rows("grouped_gemm/prefill/h800/data.csv"):
        up, down = float(r["up_mfu"]), float(r["down_mfu"])
        points.append((float(r["tokens_per_expert"]), 3.0 / (2.0 / up + 1.0 / down)))
    return Curve.from_points(points)


def moe_decode_weight_bytes_per_s(*, max_tokens_per_expert: int = 16) -> float:
    """Effective HBM read rate of grouped GEMM in decode, where it is memory bound.

    Rows with few tokens per expert read every local expert's FP8 weights once (3·h·I bytes each,
    gate+up+down) in up_us + down_us; the median of those rows' rates is the figure.
    """
    rates = []
    for r in _rows("grouped_gemm/decode/h800/data.csv"):
        if int(r["tokens_per_expert"]) > max_tokens_per_expert or int(r["num_local_experts"]) < 8:
            continue
        weight_bytes = int(r["num_local_experts"]) * 3 * int(r["hidden_size"]) * int(r["intermediate_size"])
        rates.append(weight_bytes / ((float(r["up_proj_us"]) + float(r["down_proj_us"])) * 1e-6))
    return statistics.median(rates)


def mla_prefill_mfu_by_pairs() -> Curve:
    """FlashAttention-3 MLA prefill (dense, causal, seq_len S): MFU vs attention pairs S(S+1)/2."""
    points = []
    for r in _rows("mla/prefill/h800/128-128-64.csv"):
        s = int(r["seq_len"])
        points.append((s * (s + 1) / 2, float(r["mfu"])))
    return Curve.from_points(points)


def dsa_prefill_attention_mfu_by_context() -> Curve:
    """FlashMLA sparse prefill (top-k 2048, s_q 4096): MFU vs context length s_kv."""
    rows = _rows("dsa/prefill/h800/attn-128-576-2048.csv")
    return Curve.from_points((float(r["s_kv"]), float(r["mfu"])) for r in rows)


def dsa_prefill_indexer_mfu_by_context(*, s_q: int = 2048) -> Curve:
    """DeepGEMM FP8 MQA logits (indexer) in prefill: MFU vs s_kv at the smallest measured s_q.

    The smallest s_q (2048) is the closest measured shape to agentic appends of a few hundred tokens.
    """
    rows = [r for r in _rows("dsa/prefill/h800/logits-64-128.csv") if int(r["s_q"]) == s_q]
    return Curve.from_points((float(r["s_kv"]), float(r["mfu"])) for r in rows)


def dsa_decode_attention_mfu_by_context() -> Curve:
    """FlashMLA sparse decode (FP8 KV, batch 64): MFU vs kv_len (flat beyond top-k)."""
    rows = _rows("dsa/decode/h800/attn-128-576-2048.csv")
    return Curve.from_points((float(r["kv_len"]), float(r["mfu"])) for r in rows)


def dsa_decode_indexer_mfu_by_context() -> Curve:
    """DeepGEMM FP8 MQA logits in decode (next_n 1, batch 64): MFU vs s_kv."""
    rows = [r for r in _rows("dsa/decode/h800/logits-64-128.csv") if int(r["next_n"]) == 1]
    return Curve.from_points((float(r["s_kv"]), float(r["mfu"])) for r in rows)


def decode_attention_mfu_by_batch(kind: str, num_heads: int = 128, num_kv_heads: int = 1) -> dict[int, Curve]:
    """Dense decode attention: {batch_size: MFU vs kv_len}. kind "mla" (FlashMLA) or "gqa" (FlashInfer).

    For GQA the measured file with the same KV-head count and the nearest query-head count is used.
    """
    if kind == "mla":
        rows = _rows("mla/decode/h800/128-512-64.csv")
    else:
        rows = _rows(f"mha/decode/h800/{_nearest_gqa_shape(num_heads, num_kv_heads)}.csv")
    by_batch: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        # Rows of MFU 0.0 are below the file's printed precision; they carry no shape information.
        if float(r["mfu"]) > 0.0:
            by_batch[int(r["batch_size"])].append((float(r["kv_len"]), float(r["mfu"])))
    return {b: Curve.from_points(pts) for b, pts in sorted(by_batch.items())}


_GQA_SHAPES = ((16, 2), (32, 2), (64, 2), (128, 2), (256, 2), (32, 4), (32, 8))  # files in mha/decode/h800/


def _nearest_gqa_shape(num_heads: int, num_kv_heads: int) -> str:
    def distance(shape: tuple[int, int]) -> tuple[float, float]:
        h, kv = shape
        return (abs(math.log2(kv / max(num_kv_heads, 1))), abs(math.log2(h / max(num_heads, 1))))

    h, kv = min(_GQA_SHAPES, key=distance)
    return f"{h}-{kv}-128"


def _from_points_median(points: Iterable[tuple[float, float]]) -> Curve:
    grouped: dict[float, list[float]] = defaultdict(list)
    for size, value in points:
        grouped[size].append(value)
    sizes = sorted(grouped)
    return Curve(sizes=tuple(sizes), values=tuple(statistics.median(grouped[s]) for s in sizes))
