"""Cost model: measured points reproduce, monotone in tokens, sane magnitudes, same form on CPU."""

from __future__ import annotations

import csv
import random
from importlib import resources

import pytest

from dualpath.config.specs import AttentionSpec, FfnSpec, GpuSpec, HardwareSpec, ModelSpec
from dualpath.engine.decode import DecodeEngine, DecodeNode
from dualpath.sim import cost_kernels as kern
from dualpath.sim.cost import CostModel, _runs, gpu_cost_model
from dualpath.sim.cost_kernels import Curve, CurveCursor
from dualpath.sim.driver import _decode_step_max_s

H800 = GpuSpec(
    name="h800",
    peak_bf16_flops_per_s=989e12,
    peak_fp8_flops_per_s=1979e12,
    hbm_bytes=80e9,
    hbm_bytes_per_s=3.35e12,
)
HOPPER = HardwareSpec(
    name="hopper",
    gpu=H800,
    gpus_per_node=8,
    cnic_bytes_per_s=50e9,
    snic_bytes_per_s=50e9,
    dram_bytes_per_s=500e9,
    pcie_bytes_per_s=55e9,
    dram_buffer_bytes=80e9,
    storage_bytes_per_s=6.6e12,
)


def make_deepseek_v32() -> ModelSpec:
    return ModelSpec(
        name="deepseek-v3.2",
        num_layers=61,
        hidden_size=7168,
        vocab_size=129280,
        attention=AttentionSpec(
            kind="mla", num_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
            qk_rope_head_dim=64, v_head_dim=128, sparse_top_k_tokens=2048, indexer_num_heads=64,
            indexer_head_dim=128, mla_absorbed_prefill=True,
        ),
        ffn=FfnSpec(intermediate_size=18432, num_dense_layers=3, num_routed_experts=256, num_active_experts=8,
                    num_shared_experts=1, moe_intermediate_size=2048),
        weight_bytes_per_param=1,
        kv_cache_format="mla-fp8",
    )  # fmt: skip


def make_qwen25_32b() -> ModelSpec:
    return ModelSpec(
        name="qwen2.5-32b",
        num_layers=64,
        hidden_size=5120,
        vocab_size=152064,
        attention=AttentionSpec(kind="gqa", num_heads=40, num_kv_heads=8, head_dim=128),
        ffn=FfnSpec(intermediate_size=27648),
        weight_bytes_per_param=2,
        kv_cache_format="bf16",
    )


@pytest.mark.parametrize(
    ("curve_fn", "path", "size_col", "mfu_col"),
    [
        (kern.dsa_prefill_attention_mfu_by_context, "dsa/prefill/h800/attn-128-576-2048.csv", "s_kv", "mfu"),
        (kern.dsa_decode_attention_mfu_by_context, "dsa/decode/h800/attn-128-576-2048.csv", "kv_len", "mfu"),
    ],
)
def test_interpolation_returns_measured_values_at_measured_points(curve_fn, path, size_col, mfu_col) -> None:  # type: ignore[no-untyped-def]
    curve = curve_fn()
    rows = csv.DictReader(resources.files("dualpath").joinpath("data", "kernels", *path.split("/")).open())
    for row in rows:
        assert curve.at(float(row[size_col])) == pytest.approx(float(row[mfu_col]))


def test_mla_prefill_curve_hits_measured_points_and_clamps() -> None:
    curve = kern.mla_prefill_mfu_by_pairs()
    assert curve.at(4096 * 4097 / 2) == pytest.approx(0.629)
    assert curve.at(1.0) == pytest.approx(0.372)  # below the range: the smallest measurement
    mid = curve.at((1024 * 1025 / 2) * 4)  # between measured points
    assert 0.372 < mid < 0.629


def test_curve_round_trips_through_dict() -> None:
    curve = kern.gemm_mfu_by_tokens()
    assert Curve.from_dict(curve.to_dict()) == curve


@pytest.mark.parametrize(
    "curve_fn",
    [
        kern.gemm_mfu_by_tokens,
        kern.mla_prefill_mfu_by_pairs,
        kern.dsa_prefill_attention_mfu_by_context,
        kern.moe_prefill_mfu_by_tokens_per_expert,
    ],
)
def test_a_cursor_gives_the_curves_own_values(curve_fn) -> None:  # type: ignore[no-untyped-def]
    """Bit-equal to `Curve.at` on sizes that stay in a segment, jump between segments, sit on measured
    points and fall outside the range (fails with the last segment kept after a size outside it, or
    tried without checking both ends)."""
    curve = curve_fn()
    cursor = CurveCursor(curve)
    rng = random.Random(7)
    lo, hi = curve.sizes[0], curve.sizes[-1]
    sizes = [*curve.sizes, lo / 2, hi * 2, lo, hi]
    size = (lo + hi) / 2
    for _ in range(3000):
        step = rng.random()
        if step < 0.6:
            size *= rng.uniform(0.9, 1.1)  # near the last size: mostly the same segment
        elif step < 0.9:
            size = rng.uniform(lo / 2, hi * 2)
        else:
            size = rng.choice(sizes)
        sizes.append(size)
    for size in sizes:
        assert cursor.at(size) == curve.at(size), size
    constant = Curve.constant(0.5)
    assert CurveCursor(constant).at(3.0) == constant.at(3.0)


@pytest.mark.parametrize("make_model", [make_deepseek_v32, make_qwen25_32b])
def test_prefill_time_grows_with_new_and_cached_tokens(make_model) -> None:  # type: ignore[no-untyped-def]
    cm = gpu_cost_model(make_model(), HOPPER)
    times_new = [cm.attention_layer_time_s([(16384, n)]) for n in (64, 256, 1024, 4096)]
    assert times_new == sorted(times_new) and times_new[0] > 0
    times_cached = [cm.attention_layer_time_s([(p, 429)]) for p in (0, 4096, 32768, 131072)]
    assert times_cached == sorted(times_cached)
    forwards = [cm.prefill_forward_time_s([[(32768, n)]]) for n in (100, 1000, 10000)]
    assert forwards == sorted(forwards)


@pytest.mark.parametrize("make_model", [make_deepseek_v32, make_qwen25_32b])
def test_attention_time_reusing_the_last_calls_sums_equals_a_fresh_model(make_model) -> None:  # type: ignore[no-untyped-def]
    # One model asked as §6.4 packing asks (a batch growing, its last request resized, a shorter batch,
    # a different head, an idle GPU, a shorter batch whose stale tail matches the next one): each answer
    # must equal a fresh model's, bit for bit.
    cm = gpu_cost_model(make_model(), HOPPER)
    a, b, c, d = (32768, 429), (1024, 4096), (60000, 0), (8192, 1)
    calls = [[a], [a, b], [a, b, c], [a, b, (40000, 17)], [a, b, (40000, 900)], [a], [], [a, b, c, d],
             [b, a], [b], [d, c, b, a], [d, c], [(0, 5)], [a, b, c], [b], [b, b, c]]  # fmt: skip
    for batch in calls:
        fresh = CostModel(cm.model, cm.coefficients)
        assert cm.attention_layer_time_s(batch) == fresh.attention_layer_time_s(batch), batch


@pytest.mark.parametrize("make_model", [make_deepseek_v32, make_qwen25_32b])
def test_decode_time_grows_with_batch_and_context(make_model) -> None:  # type: ignore[no-untyped-def]
    cm = gpu_cost_model(make_model(), HOPPER, decode_ep_size=32)
    by_batch = [cm.decode_step_time_s(b, b * 8192) for b in (1, 8, 64, 256)]
    assert by_batch == sorted(by_batch)
    by_context = [cm.decode_step_time_s(32, 32 * c) for c in (1024, 8192, 65536)]
    assert by_context == sorted(by_context)


def test_group_step_waits_for_the_slowest_gpu() -> None:
    cm = gpu_cost_model(make_deepseek_v32(), HOPPER)
    balanced = cm.prefill_layer_time_s([[(32768, 429)]] * 8)
    skewed = cm.prefill_layer_time_s([[(32768, 429)] * 4] + [[(32768, 429)]] * 7)
    assert skewed > balanced + 2.5 * cm.attention_layer_time_s([(32768, 429)])


def test_sanity_magnitudes_deepseek_v32_on_h800() -> None:
    # Hand roofline: DSA main 429·2048 pairs × 278,528 FLOP at 0.64 of 989 TFLOP/s ≈ 0.39 ms, plus the
    # indexer 429·~33K pairs × 16,384 FLOP at 0.59 of 1,979 TFLOP/s ≈ 0.20 ms.
    cm = gpu_cost_model(make_deepseek_v32(), HOPPER)
    assert 0.4e-3 < cm.attention_layer_time_s([(32768, 429)]) < 0.8e-3
    forward = cm.prefill_forward_time_s([[(32768, 429)]] * 8)
    assert 0.03 < forward < 0.3
    assert 0.01 < cm.decode_step_time_s(64, 64 * 32768) < 0.1


def test_cpu_coefficients_use_the_same_form() -> None:
    # A CPU "calibration": 100 GFLOP/s everywhere, constant efficiency, 1 ms per layer.
    coeffs = {
        "bf16_flops_per_s": 1e11,
        "linear_flops_per_s": 1e11,
        "fp8_flops_per_s": 1e11,
        "weight_read_bytes_per_s": 1e10,
        "layer_overhead_s": 1e-3,
        "step_overhead_s": 2e-3,
    }
    tiny = ModelSpec(
        name="tiny",
        num_layers=2,
        hidden_size=64,
        vocab_size=100,
        attention=AttentionSpec(kind="gqa", num_heads=4, num_kv_heads=2, head_dim=16),
        ffn=FfnSpec(intermediate_size=128),
        weight_bytes_per_param=4,
        kv_cache_format="fp32",
    )
    cm = CostModel.from_dict(tiny, coeffs)
    # Attention: 4·h·d FLOP per pair = 256; 10 new tokens over 0 cached = 55 pairs.
    assert cm.attention_layer_time_s([(0, 10)]) == pytest.approx(55 * 256 / 1e11)
    assert cm.decode_step_time_s(1, 64) >= 2 * 1e-3 + 2e-3
    assert CostModel.from_dict(tiny, cm.to_dict()).to_dict() == cm.to_dict()
    with pytest.raises(ValueError, match="unknown cost coefficients"):
        CostModel.from_dict(tiny, {**coeffs, "bogus": 1.0})


def test_round_half_even_is_the_builtin_round() -> None:
    import random

    from dualpath.sim.cost import round_half_even

    rng = random.Random(3)
    halves = [k + 0.5 for k in range(200)]  # every tie, both parities
    near = [k + d for k in range(50) for d in (0.4999999999999999, 0.5000000000000001, 1e-12, -1e-12)]
    spread = [rng.uniform(0, 1e6) for _ in range(20_000)] + [rng.uniform(0, 3) for _ in range(20_000)]
    for x in [0.0, 1.0, 2.0**40 + 0.5, *halves, *(v for v in near if v >= 0), *spread]:
        assert round_half_even(x) == round(x), x


@pytest.mark.parametrize("make_model", [make_deepseek_v32, make_qwen25_32b])
def test_decode_step_max_is_the_slowest_engines_decode_step(make_model) -> None:  # type: ignore[no-untyped-def]
    # Its cached rows of (batch, context bucket) give decode_step_time_s's numbers, ties and all.
    cm = gpu_cost_model(make_model(), HOPPER, decode_ep_size=32)
    shapes = [
        ((3, 300), (1, 96)),
        ((7, 224), (2, 128), (0, 0)),
        ((5, 5 * 96),),
        ((40, 40 * 32 + 20), (39, 3)),
    ]
    for shape in shapes * 2:  # the second pass reads the rows the first one filled
        assert cm.decode_step_max_s(shape) == max(cm.decode_step_time_s(b, ctx) for b, ctx in shape)


@pytest.mark.parametrize("make_model", [make_deepseek_v32, make_qwen25_32b])
def test_a_decode_nodes_step_costed_engine_by_engine_is_its_shapes(make_model) -> None:  # type: ignore[no-untyped-def]
    # The simulator costs a DE node's step per engine (`driver._decode_step_max_s`), without the shape.
    cm = gpu_cost_model(make_model(), HOPPER, decode_ep_size=32)
    engines = [DecodeEngine(i, 1, hbm_tokens=10**6) for i in range(4)]
    node = DecodeNode(1, engines, block_tokens=64)
    for steps_done, batches in ((0, (3, 1, 0, 7)), (17, (40, 2, 5, 0)), (250, (0, 0, 0, 1))):
        node.steps_done = steps_done
        for e, running in zip(engines, batches, strict=True):
            e.running, e.ctx_base = running, running * 300 - steps_done * running + e.engine_id
        assert _decode_step_max_s(cm, node) == cm.decode_step_max_s(node.shape())
        assert node.shape()[1] == (engines[1].running, node.context_tokens(engines[1]))


def test_runs_of_equal_neighbours() -> None:
    assert _runs([0, 0, 1, 1, 1, 0]) == ([0, 1, 0], [2, 3, 1])
    assert _runs([]) == ([], []) and _runs([2]) == ([2], [1])


@pytest.mark.parametrize("make_model", [make_deepseek_v32, make_qwen25_32b])
def test_a_steps_layers_summed_by_runs_are_the_layer_by_layer_sum(make_model) -> None:  # type: ignore[no-untyped-def]
    # `_sum_layers` reads each run's time once; the float must be the layer-by-layer sum's, bit for bit,
    # and a prefill step's forward must equal `prefill_forward_time_s` exactly.
    cm = gpu_cost_model(make_model(), HOPPER)
    assert sum(cm._run_lengths) == len(cm._layer_kind_index)  # noqa: SLF001
    rng = random.Random(5)
    for _ in range(300):
        per_kind = [rng.uniform(1e-6, 1e-2) for _ in cm._kinds]  # noqa: SLF001
        by_layer = 0.0
        for k in cm._layer_kind_index:  # noqa: SLF001
            by_layer += per_kind[k]
        assert cm._sum_layers(per_kind) == by_layer  # noqa: SLF001
    for batches in ([[(32768, 429)]] * 8, [[(1024, 4096), (0, 17)], [], [(60000, 1)]]):
        assert cm.prefill_step_s(batches, 0)[0] == cm.prefill_forward_time_s(batches)
