"""GPU (or CPU) time of a prefill layer and a decode step, from the architecture and kernel data.

NOTE: one form, two sets of coefficients. Every kernel's time is `FLOPs / (peak × efficiency(shape))`,
floored by `weight bytes / read rate` where weights must be streamed; `CostCoefficients` holds the
peaks, rates and efficiency curves. On Hopper they come from measured H800 kernels
(`dualpath/data/kernels`, via `cost_kernels`); for the runtime's CPU models `dualpath calibrate` fits
constant efficiencies and overheads and loads them with `CostModel.from_dict`.

Prefill on a PE group (paper §6.4: DP attention + EP MoE, lock-stepped across the node's GPUs):

    layer = max over GPUs (attention_g + dense linear_g)         DP part: the slowest GPU sets the pace
          + max(routed-expert GEMMs, EP all-to-all)              EP part: shared; comm overlapped by
          + layer_overhead_s                                     two micro-batches (deepseek-ai/profile-data)

Decode on one DE GPU (batch B, context C; EP peers assumed equally loaded):

    step = Σ layers [attention(B, C/B) + dense linear(B) + max(experts(B), all-to-all(B))]
         + LM head + step_overhead_s
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final, final

from mypy_extensions import i64

from dualpath.architecture import arch
from dualpath.config.specs import HardwareSpec, ModelSpec
from dualpath.sim import cost_kernels as kern
from dualpath.sim.cost_kernels import Curve, CurveCursor

Request = tuple[
    int, int
]  # (cached_tokens, new_tokens) of one request on one GPU (paper §6.4 "(cached, bsz)")

# H800 SXM HBM3 bandwidth, the GPU the kernel data was measured on (NVIDIA H800 datasheet, PUBLIC-FACTS).
H800_HBM_BYTES_PER_S: Final = 3.35e12
# DeepEP intranode "normal" kernels, EP8 over NVLink: dispatch 153 GB/s, combine 158 GB/s bottleneck
# bandwidth (deepseek-ai/DeepEP README, H800); their mean stands for prefill all-to-all.
PREFILL_A2A_BYTES_PER_S: Final = 155e9
# DeepEP low-latency kernels, EP8 (deepseek-ai/DeepEP README, H800): dispatch 98 GB/s, combine 127 GB/s.
DECODE_DISPATCH_BYTES_PER_S: Final = 98e9
DECODE_COMBINE_BYTES_PER_S: Final = 127e9
# DeepEP sends FP8 tokens (1 B/value) and combines in BF16 (2 B/value) (deepseek-ai/DeepEP README).
DISPATCH_BYTES_PER_VALUE: Final = 1.0
COMBINE_BYTES_PER_VALUE: Final = 2.0
# Decode contexts are bucketed to this many tokens per sequence for caching (one Full Block, §4.1):
# an error below 64 / context, < 0.4 % at 16K.
DECODE_CONTEXT_BUCKET_TOKENS: Final = 64


@dataclass(frozen=True, kw_only=True)
class CostCoefficients:
    """Everything device-specific. Rates in FLOP/s and bytes/s; times in seconds."""

    bf16_flops_per_s: float  # attention kernels (BF16 in every measured file)
    linear_flops_per_s: float  # projections and experts (FP8 peak for FP8 weights, else BF16)
    fp8_flops_per_s: float  # DSA indexer logits (DeepGEMM FP8 MQA logits)
    weight_read_bytes_per_s: float  # achieved HBM read rate streaming weights
    ep_size: int = 1  # decode: GPUs sharing routed experts; 1 = no all-to-all (prefill: the group size)
    prefill_a2a_bytes_per_s: float = PREFILL_A2A_BYTES_PER_S
    decode_dispatch_bytes_per_s: float = DECODE_DISPATCH_BYTES_PER_S
    decode_combine_bytes_per_s: float = DECODE_COMBINE_BYTES_PER_S
    layer_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    prefill_attention: Curve = field(default_factory=lambda: Curve.constant(1.0))  # vs causal pairs
    sparse_prefill_attention: Curve = field(default_factory=lambda: Curve.constant(1.0))  # vs context
    prefill_indexer: Curve = field(default_factory=lambda: Curve.constant(1.0))  # vs context
    gemm: Curve = field(default_factory=lambda: Curve.constant(1.0))  # vs tokens (m)
    moe: Curve = field(default_factory=lambda: Curve.constant(1.0))  # vs tokens per expert
    decode_attention: dict[int, Curve] = field(
        default_factory=lambda: {1: Curve.constant(1.0)}
    )  # batch -> vs kv_len
    sparse_decode_attention: Curve = field(default_factory=lambda: Curve.constant(1.0))  # vs context
    decode_indexer: Curve = field(default_factory=lambda: Curve.constant(1.0))  # vs context

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "decode_attention":
                out[f.name] = {str(b): c.to_dict() for b, c in value.items()}
            elif isinstance(value, Curve):
                out[f.name] = value.to_dict()  # its points only (`Curve.log2_sizes` is derived)
            else:
                out[f.name] = value
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CostCoefficients:
        known = set(CostCoefficients.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown cost coefficients {sorted(unknown)}; expected some of {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key == "decode_attention":
                kwargs[key] = {int(b): Curve.from_dict(c) for b, c in value.items()}
            elif isinstance(value, dict):
                kwargs[key] = Curve.from_dict(value)
            else:
                kwargs[key] = value
        return CostCoefficients(**kwargs)


def h800_derived_coefficients(
    model: ModelSpec, hw: HardwareSpec, *, decode_ep_size: int | None = None
) -> CostCoefficients:
    """Coefficients for a Hopper-class GPU: its peaks × the H800 measured efficiency curves.

    `decode_ep_size`: GPUs sharing the routed experts in decode (default: one node). The paper does not
    give it (§7.1 says only "EP + DP"); DeepSeek-V3's experts need EP ≥ 16 to fit 80 GB of HBM.
    """
    gpu = hw.gpu
    a = model.attention
    read_efficiency = kern.moe_decode_weight_bytes_per_s() / H800_HBM_BYTES_PER_S
    return CostCoefficients(
        bf16_flops_per_s=gpu.peak_bf16_flops_per_s,
        linear_flops_per_s=gpu.peak_fp8_flops_per_s
        if model.weight_bytes_per_param <= 1
        else gpu.peak_bf16_flops_per_s,
        fp8_flops_per_s=gpu.peak_fp8_flops_per_s,
        weight_read_bytes_per_s=gpu.hbm_bytes_per_s * read_efficiency,
        ep_size=(decode_ep_size or hw.gpus_per_node) if model.ffn.num_routed_experts > 0 else 1,
        # Kernel launch floors are inside the measured latencies (e.g. a 16-token GEMM takes 16 µs), so
        # no extra per-layer or per-step constant is invented here.
        layer_overhead_s=0.0,
        step_overhead_s=0.0,
        prefill_attention=kern.mla_prefill_mfu_by_pairs(),  # FA3; stands in for GQA prefill too
        sparse_prefill_attention=kern.dsa_prefill_attention_mfu_by_context(),
        prefill_indexer=kern.dsa_prefill_indexer_mfu_by_context(),
        gemm=kern.gemm_mfu_by_tokens(),
        moe=kern.moe_prefill_mfu_by_tokens_per_expert(),
        decode_attention=kern.decode_attention_mfu_by_batch(a.kind, a.num_heads, a.num_kv_heads),
        sparse_decode_attention=kern.dsa_decode_attention_mfu_by_context(),
        decode_indexer=kern.dsa_decode_indexer_mfu_by_context(),
    )


@functools.lru_cache(maxsize=64)
def gpu_cost_model(model: ModelSpec, hw: HardwareSpec, *, decode_ep_size: int | None = None) -> CostModel:
    """The Hopper cost model for (model, hw), built once per pair (a pure-function memo)."""
    return CostModel(model, h800_derived_coefficients(model, hw, decode_ep_size=decode_ep_size))


def prefill_layer_time_s(
    model: ModelSpec, hw: HardwareSpec, per_gpu_batches: Sequence[Sequence[Request]]
) -> float:
    return gpu_cost_model(model, hw).prefill_layer_time_s(per_gpu_batches)


def attention_layer_time_s(model: ModelSpec, hw: HardwareSpec, requests: Sequence[Request]) -> float:
    return gpu_cost_model(model, hw).attention_layer_time_s(requests)


def decode_step_time_s(
    model: ModelSpec, hw: HardwareSpec, batch_size: int, total_context_tokens: int
) -> float:
    return gpu_cost_model(model, hw).decode_step_time_s(batch_size, total_context_tokens)


def _new_tokens(batch: Sequence[Request]) -> tuple[int, int]:
    """(new tokens, requests with new tokens) of one GPU's batch of (cached, new) requests."""
    # A list, indexed natively (`CostModel.attention_layer_time_s`).
    items: list[Request] = batch if isinstance(batch, list) else list(batch)
    total = count = 0
    for i in range(len(items)):
        new = items[i][1]
        total += new
        if new > 0:
            count += 1
    return total, count


@dataclass(frozen=True)
class _LayerKind:
    """What a layer costs per token; layers with equal numbers share one evaluation."""

    dense_flops_per_token: float  # attention projections + dense FFN / shared experts
    dense_weight_bytes: float
    routed_flops_per_token: float  # active routed experts (0 for a dense layer)
    routed_weight_bytes: float  # all routed experts of the layer (the EP group splits them)
    moe: bool


@final
class _AttentionSums:
    """`CostModel.attention_layer_time_s`'s running sums over a batch's first k requests, in fields the
    native build keeps unboxed (a tuple of them would box four numbers per request)."""

    __slots__ = ("main_pairs", "indexer_pairs", "weighted_context", "new_total")

    def __init__(self) -> None:
        self.main_pairs = 0
        self.indexer_pairs = 0
        self.weighted_context = 0.0
        self.new_total = 0


class CostModel:
    """Times for one model on one device kind. Cheap to call; decode steps are memoised."""

    def __init__(self, model: ModelSpec, coefficients: CostCoefficients):
        self.model = model
        self.coefficients = coefficients
        # The MoE sizes read per layer kind and step: plain fields, not lookups on the (interpreted) spec.
        self._active_experts = model.ffn.num_active_experts
        self._routed_experts = model.ffn.num_routed_experts
        self._hidden_size = model.hidden_size
        a = model.attention
        self._top_k = a.sparse_top_k_tokens
        self._main_flops_per_pair = arch.attention_flops(model, 0, 1) - _indexer_pair_flops(model)
        self._indexer_flops_per_pair = _indexer_pair_flops(model)
        self._kinds, self._layer_kind = _layer_kinds(model)
        # Each layer's kind as its index in `_kinds`: a step sums its layers from a list, not a dict by id.
        self._layer_kind_index = [
            next(i for i, k in enumerate(self._kinds) if k is kind) for kind in self._layer_kind
        ]
        # The same as runs of consecutive layers of one kind (DS-V3.2: 3 dense, then 58 MoE): `_sum_layers`.
        self._run_kinds, self._run_lengths = _runs(self._layer_kind_index)
        self._lm_head_flops_per_token = arch.lm_head_flops_per_token(model)
        self._lm_head_bytes = model.hidden_size * model.vocab_size * model.weight_bytes_per_param
        self._decode_cache = functools.lru_cache(maxsize=1 << 16)(self._decode_step_bucketed)
        # [batch][per-sequence context buckets] -> step time (-1.0: not computed yet), for
        # `decode_engine_step_s`: the simulator asks for every DE of a node at each batch change (≈850 K calls
        # at 512 agents), with few distinct keys. Rows of a list, grown on demand: no key to build and hash.
        self._decode_steps: list[list[float]] = []
        # The last `attention_layer_time_s` call's requests and its running sums after each of them
        # (`_attention_sums`): see that method's NOTE.
        self._attention_prefix: list[tuple[int, int]] = []
        self._attention_sums: list[_AttentionSums] = [_AttentionSums()]
        self._attention_len = 0  # how many of `_attention_prefix` are the last call's (the rest: stale)
        # The prefill's curves, each behind a cursor that tries its last segment first (`CurveCursor`:
        # the same values as `Curve.at`). `coefficients` is fixed for the model's life.
        c = coefficients
        self._sparse_prefill_attention = CurveCursor(c.sparse_prefill_attention)
        self._prefill_indexer = CurveCursor(c.prefill_indexer)
        self._prefill_attention = CurveCursor(c.prefill_attention)
        self._gemm_by_gpu = CurveCursor(c.gemm)

    @staticmethod
    def from_dict(model: ModelSpec, coefficients: dict[str, Any]) -> CostModel:
        return CostModel(model, CostCoefficients.from_dict(coefficients))

    def to_dict(self) -> dict[str, Any]:
        return self.coefficients.to_dict()

    # -- prefill ---------------------------------------------------------------------------------

    def attention_layer_time_s(self, requests: Sequence[Request]) -> float:
        """Attention time of one layer on one GPU for these (cached, new) requests (§6.4 quota fit).

        NOTE: §6.4 packing asks for a growing batch and then binary-searches its last request's size
        (`policy.batching.pack_by_compute_quota`), each call with the whole batch so far: the same
        leading requests again and again. The sums over the requests that lead the previous call too
        are taken from it (`_attention_sums[k]`: the sums over its first k requests), and only the rest
        is added up. The sums are built in the same order as a fresh loop, so the result is identical.
        The lists keep their slots between calls (`_attention_len` says how many are current) and the
        sums' records are rewritten in place: no list shrinks and no number is boxed per request.
        """
        # Every driver passes a list: the native build indexes a list directly, a Sequence through the
        # generic protocol with a boxed index per read (another sequence is copied once).
        batch: list[Request] = requests if isinstance(requests, list) else list(requests)
        if not batch:
            return 0.0  # an idle GPU of the step: what the sums give, and the previous call's prefix kept
        c = self.coefficients
        prefix, sums = self._attention_prefix, self._attention_sums
        n = len(batch)
        k, same = 0, min(self._attention_len, n)
        while k < same and prefix[k] == batch[k]:
            k += 1
        base = sums[k]
        main_pairs, indexer_pairs = base.main_pairs, base.indexer_pairs
        weighted_context, new_total = base.weighted_context, base.new_total
        for i in range(k, n):
            item = batch[i]
            cached, new = item
            if i < len(prefix):
                prefix[i] = item  # the caller's (immutable) pair, kept as is
            else:
                prefix.append(item)
            if new > 0:
                main_pairs += arch.causal_key_count(cached, new, self._top_k)
                if self._indexer_flops_per_pair:
                    indexer_pairs += arch.causal_key_count(cached, new)
                weighted_context += new * (cached + new)
                new_total += new
            if i + 1 == len(sums):
                sums.append(_AttentionSums())
            after = sums[i + 1]
            after.main_pairs, after.indexer_pairs = main_pairs, indexer_pairs
            after.weighted_context, after.new_total = weighted_context, new_total
        self._attention_len = n
        if new_total == 0:
            return 0.0
        main_flops = main_pairs * self._main_flops_per_pair
        if self._top_k:
            context = weighted_context / new_total
            time_s = main_flops / (c.bf16_flops_per_s * self._sparse_prefill_attention.at(context))
            indexer_flops = indexer_pairs * self._indexer_flops_per_pair
            return time_s + indexer_flops / (c.fp8_flops_per_s * self._prefill_indexer.at(context))
        return main_flops / (c.bf16_flops_per_s * self._prefill_attention.at(main_pairs))

    def prefill_layer_time_s(
        self, per_gpu_batches: Sequence[Sequence[Request]], layer_index: int | None = None
    ) -> float:
        """One layer of a lock-stepped group (one batch per GPU). None: a typical (MoE if any) layer."""
        kind = self._kinds[-1] if layer_index is None else self._layer_kind[layer_index]
        attention = [self.attention_layer_time_s(batch) for batch in per_gpu_batches]
        tokens = [_new_tokens(batch)[0] for batch in per_gpu_batches]
        return self._prefill_layer(kind, attention, tokens, self._gemm_at(tokens))

    def prefill_layer_times_s(self, per_gpu_batches: Sequence[Sequence[Request]]) -> tuple[float, ...]:
        attention = [self.attention_layer_time_s(batch) for batch in per_gpu_batches]
        tokens = [_new_tokens(batch)[0] for batch in per_gpu_batches]
        gemm = self._gemm_at(tokens)
        by_kind = {id(k): self._prefill_layer(k, attention, tokens, gemm) for k in self._kinds}
        return tuple(by_kind[id(k)] for k in self._layer_kind)

    def prefill_step_s(
        self, per_gpu_batches: Sequence[Sequence[Request]], layer_index: int
    ) -> tuple[float, float, list[float]]:
        """(`prefill_forward_time_s`, `prefill_layer_time_s(.., layer_index)`, one layer's attention per
        GPU) of one lock-stepped step, each per-GPU attention evaluated once instead of three times.
        Bit-identical to the three separate calls (same operations in the same order)."""
        attention: list[float] = []
        tokens: list[int] = []  # new tokens per GPU
        most_requests = 0  # the most requests with new tokens on one GPU: the LM head's batch
        batches: list[Sequence[Request]] = (
            per_gpu_batches if isinstance(per_gpu_batches, list) else list(per_gpu_batches)
        )
        for batch in batches:  # one pass over the batches (a list: iterated natively)
            attention.append(self.attention_layer_time_s(batch))
            total, count = _new_tokens(batch)
            tokens.append(total)
            if count > most_requests:
                most_requests = count
        gemm = self._gemm_at(tokens)  # once per GPU, not once per layer kind
        per_kind = [self._prefill_layer(k, attention, tokens, gemm) for k in self._kinds]
        layers = self._sum_layers(per_kind)  # the same sum as `prefill_forward_time_s`
        return (
            layers + self._lm_head_for(most_requests),
            per_kind[self._layer_kind_index[layer_index]],
            attention,
        )

    def prefill_forward_time_s(self, per_gpu_batches: Sequence[Sequence[Request]]) -> float:
        """All layers plus the LM head on each request's last position."""
        return sum(self.prefill_layer_times_s(per_gpu_batches)) + self._lm_head_s(per_gpu_batches)

    def _lm_head_s(self, per_gpu_batches: Sequence[Sequence[Request]]) -> float:
        requests = 0  # the most requests with new tokens on one GPU (loops: no interpreted max/sum call)
        for batch in per_gpu_batches:
            count = _new_tokens(batch)[1]
            if count > requests:
                requests = count
        return self._lm_head_for(requests)

    def _lm_head_for(self, requests: int) -> float:
        """The LM head on each GPU's last positions, `requests` of them on the busiest GPU."""
        c = self.coefficients
        if not requests:
            return 0.0
        lm_flops = requests * self._lm_head_flops_per_token
        return max(
            lm_flops / (c.linear_flops_per_s * c.gemm.at(requests)),
            self._lm_head_bytes / c.weight_read_bytes_per_s,
        )

    def _gemm_at(self, tokens: list[int]) -> list[float]:
        """The GEMM efficiency at each GPU's token count (0.0 where it has none, unused there)."""
        gemm = self._gemm_by_gpu
        return [gemm.at(n) if n > 0 else 0.0 for n in tokens]

    def _prefill_layer(
        self, kind: _LayerKind, attention: list[float], tokens: list[int], gemm: list[float]
    ) -> float:
        # Lists, not Sequences: the native build indexes a list directly, a Sequence through the generic
        # protocol with a boxed index per read. `gemm`: `_gemm_at(tokens)`.
        c = self.coefficients
        if len(attention) != len(tokens):
            raise ValueError("one attention time and one token count per GPU")
        slowest = 0.0
        group_tokens = 0
        most_tokens = 0
        for i in range(len(tokens)):  # index loops, not zip/sum/max: no interpreted builtin calls per step
            n = tokens[i]
            dense = self._dense_linear_at(kind, n, gemm[i]) if n > 0 else 0.0
            slowest = max(slowest, attention[i] + dense)
            group_tokens += n
            if i == 0 or n > most_tokens:
                most_tokens = n
        if not kind.moe:
            return slowest + c.layer_overhead_s
        ep = max(1, len(tokens)) if c.ep_size > 1 else 1
        experts_s = self._experts_s(kind, group_tokens, ep)
        comm_s = 0.0
        if ep > 1:
            values = most_tokens * self._active_experts * self._hidden_size
            comm_s = values * (DISPATCH_BYTES_PER_VALUE + COMBINE_BYTES_PER_VALUE) / c.prefill_a2a_bytes_per_s
        return slowest + max(experts_s, comm_s) + c.layer_overhead_s

    def _dense_linear_s(self, kind: _LayerKind, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return self._dense_linear_at(kind, tokens, self.coefficients.gemm.at(tokens))

    def _dense_linear_at(self, kind: _LayerKind, tokens: int, gemm_efficiency: float) -> float:
        """`_dense_linear_s` with the GEMM curve already read at `tokens` (> 0)."""
        c = self.coefficients
        compute = tokens * kind.dense_flops_per_token / (c.linear_flops_per_s * gemm_efficiency)
        return max(compute, kind.dense_weight_bytes / c.weight_read_bytes_per_s)

    def _experts_s(self, kind: _LayerKind, group_tokens: int, ep: int) -> float:
        """Routed experts on one GPU of an EP group of `ep` GPUs that together hold `group_tokens`."""
        if group_tokens <= 0:
            return 0.0
        c, routed = self.coefficients, self._routed_experts
        assignments = group_tokens * self._active_experts
        tokens_per_expert = assignments / routed
        compute = (
            group_tokens
            * kind.routed_flops_per_token
            / ep
            / (c.linear_flops_per_s * c.moe.at(tokens_per_expert))
        )
        # Experts no token picked are not read: P(touched) = 1 - (1 - 1/E)^assignments.
        touched = 1.0 - math.exp(assignments * math.log1p(-1.0 / routed))
        read = kind.routed_weight_bytes / ep * touched / c.weight_read_bytes_per_s
        return max(compute, read)

    # -- decode ----------------------------------------------------------------------------------

    def decode_step_time_s(self, batch_size: int, total_context_tokens: int) -> float:
        """One decode step of `batch_size` sequences holding `total_context_tokens` on one GPU."""
        if batch_size <= 0:
            return 0.0
        bucket = DECODE_CONTEXT_BUCKET_TOKENS
        per_seq_buckets = max(1, round(total_context_tokens / batch_size / bucket))
        return self._decode_cache(batch_size, per_seq_buckets)

    def decode_step_max_s(self, shape: Sequence[tuple[int, int]]) -> float:
        """max(decode_step_time_s(b, ctx) for b, ctx in shape): a lock-stepped node's step (non-empty)."""
        best = -1.0
        for batch_size, total_context_tokens in shape:
            t = self.decode_engine_step_s(batch_size, total_context_tokens)
            if t > best:
                best = t
        if best < 0.0:
            raise ValueError("decode_step_max_s needs at least one engine")
        return best

    def decode_engine_step_s(self, batch_size: int, total_context_tokens: int) -> float:
        """`decode_step_time_s` from the table of bucketed steps: one engine's share of
        `decode_step_max_s` (the simulator asks per engine without building a shape)."""
        if batch_size <= 0:
            return 0.0
        rows = self._decode_steps
        buckets = max(1, round_half_even(total_context_tokens / batch_size / DECODE_CONTEXT_BUCKET_TOKENS))
        if batch_size >= len(rows):
            rows.extend([] for _ in range(batch_size + 1 - len(rows)))
        row = rows[batch_size]
        if buckets >= len(row):
            row.extend([-1.0] * (buckets + 1 - len(row)))
        t = row[buckets]
        if t < 0.0:
            t = row[buckets] = self._decode_cache(batch_size, buckets)
        return t

    def _decode_step_bucketed(self, batch_size: int, per_seq_buckets: int) -> float:
        c = self.coefficients
        context = per_seq_buckets * DECODE_CONTEXT_BUCKET_TOKENS
        attention_s = self._decode_attention_s(batch_size, context)
        total = 0.0
        per_kind: list[float] = []  # by index in `_kinds`, as `prefill_step_s` (no dict keyed by `id`)
        for kind in self._kinds:
            layer = attention_s + self._dense_linear_s(kind, batch_size)
            if kind.moe:
                ep = c.ep_size
                experts_s = self._experts_s(kind, batch_size * ep, ep)
                comm_s = 0.0
                if ep > 1:
                    values = batch_size * self._active_experts * self._hidden_size
                    comm_s = values * (
                        DISPATCH_BYTES_PER_VALUE / c.decode_dispatch_bytes_per_s
                        + COMBINE_BYTES_PER_VALUE / c.decode_combine_bytes_per_s
                    )
                layer += max(experts_s, comm_s)
            per_kind.append(layer + c.layer_overhead_s)
        total += self._sum_layers(per_kind)
        lm_flops = batch_size * self._lm_head_flops_per_token
        lm_head = max(
            lm_flops / (c.linear_flops_per_s * c.gemm.at(batch_size)),
            self._lm_head_bytes / c.weight_read_bytes_per_s,
        )
        return total + lm_head + c.step_overhead_s

    def _sum_layers(self, per_kind: list[float]) -> float:
        """Σ over the model's layers of its kind's time (`per_kind`, by index in `_kinds`), layer by layer in
        order from 0.0: the same additions as a loop over `_layer_kind_index`, so the same float. A run's
        time is read (unboxed) once for its layers, not once per layer (61 per prefill step for DS-V3.2)."""
        total = 0.0
        kinds, lengths = self._run_kinds, self._run_lengths
        for r in range(len(kinds)):
            t = per_kind[kinds[r]]
            left: i64 = lengths[r]  # a native counter (a `for _ in range(...)` boxes `_` at each pass)
            while left > 0:
                total += t
                left -= 1
        return total

    def _decode_attention_s(self, batch_size: int, context: int) -> float:
        c, m = self.coefficients, self.model
        if self._top_k:
            main_keys = min(context, self._top_k)
            main = batch_size * main_keys * _absorbed_pair_flops(m)
            index = batch_size * context * self._indexer_flops_per_pair
            return main / (c.bf16_flops_per_s * c.sparse_decode_attention.at(context)) + index / (
                c.fp8_flops_per_s * c.decode_indexer.at(context)
            )
        flops = batch_size * arch.decode_attention_flops(m, context)
        return flops / (c.bf16_flops_per_s * _surface_at(c.decode_attention, batch_size, context))


def round_half_even(x: float) -> int:
    """`round(x)` for 0 <= x < 2**52 (ties to even), in compiled code: the native build calls the `round`
    builtin through the interpreter. x - int(x) is exact there, so the ties are the builtin's."""
    whole = int(x)
    rest = x - whole
    if rest > 0.5 or (rest == 0.5 and whole % 2 == 1):
        return whole + 1
    return whole


def _surface_at(surface: dict[int, Curve], batch_size: int, kv_len: float) -> float:
    """Interpolate {batch: curve over kv_len} in log2(batch) between the two nearest measured batches."""
    batches = sorted(surface)
    if batch_size <= batches[0]:
        return surface[batches[0]].at(kv_len)
    if batch_size >= batches[-1]:
        return surface[batches[-1]].at(kv_len)
    hi = next(i for i, b in enumerate(batches) if b >= batch_size)
    b0, b1 = batches[hi - 1], batches[hi]
    w = (math.log2(batch_size) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
    return (1 - w) * surface[b0].at(kv_len) + w * surface[b1].at(kv_len)


def _indexer_pair_flops(m: ModelSpec) -> float:
    a = m.attention
    return 2.0 * a.indexer_num_heads * a.indexer_head_dim


def _absorbed_pair_flops(m: ModelSpec) -> float:
    # One decode query over one cached key with MLA absorbed (PUBLIC-FACTS "Attention FLOPs").
    return arch.decode_attention_flops(m, 1) - _indexer_pair_flops(m)


def _runs(values: list[int]) -> tuple[list[int], list[int]]:
    """`values` as runs of equal neighbours: (the value of each run, its length), in order."""
    run_values: list[int] = []
    run_lengths: list[int] = []
    for v in values:
        if run_values and run_values[-1] == v:
            run_lengths[-1] += 1
        else:
            run_values.append(v)
            run_lengths.append(1)
    return run_values, run_lengths


def _layer_kinds(model: ModelSpec) -> tuple[list[_LayerKind], list[_LayerKind]]:
    """Distinct layer kinds (dense first, MoE last) and the kind of each layer."""
    f, h, w = model.ffn, model.hidden_size, model.weight_bytes_per_param
    expert_params = 3.0 * h * f.moe_intermediate_size
    kinds: dict[_LayerKind, _LayerKind] = {}
    per_layer = []
    for i in range(model.num_layers):
        moe = arch.is_moe_layer(model, i)
        routed_active = f.num_active_experts * expert_params if moe else 0.0
        dense_params = arch.attention_params(model) + arch.ffn_active_params(model, i) - routed_active
        kind = _LayerKind(
            dense_flops_per_token=2.0 * dense_params,
            dense_weight_bytes=dense_params * w,
            routed_flops_per_token=2.0 * routed_active,
            routed_weight_bytes=(f.num_routed_experts * expert_params * w) if moe else 0.0,
            moe=moe,
        )
        per_layer.append(kinds.setdefault(kind, kind))
    ordered = sorted(kinds.values(), key=lambda k: k.moe)
    return ordered, per_layer
