"""Architecture math against the published numbers in PUBLIC-FACTS.md and closed forms."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath.architecture import arch
from dualpath.config.specs import ModelSpec


def test_qwen25_32b_kv_is_4kib_per_layer_and_256kib_per_token(qwen: ModelSpec) -> None:
    m = qwen
    assert arch.kv_bytes_per_token_per_layer(m) == 4096
    assert arch.kv_bytes_per_token(m) == 256 * 1024


def test_deepseek_fp8_mla_cache_is_656_bytes_plus_132_for_indexer(deepseek: Callable[..., ModelSpec]) -> None:
    m = deepseek(sparse=True)
    assert arch.kv_bytes_per_token_per_layer(m) == 656
    with_indexer = dataclasses.replace(m, kv_includes_indexer=True)
    assert arch.kv_bytes_per_token_per_layer(with_indexer) == 788


def test_deepseek_bf16_mla_cache_is_576_values(deepseek: Callable[..., ModelSpec]) -> None:
    m = deepseek(sparse=False, kv_cache_format="bf16")
    assert arch.kv_bytes_per_token_per_layer(m) == 1152


def test_block_sizes_at_64_tokens(qwen: ModelSpec, deepseek: Callable[..., ModelSpec]) -> None:
    qwen = qwen
    assert arch.layer_block_bytes(qwen, 64) == 256 * 1024
    assert arch.full_block_bytes(qwen, 64) == 16 * 1024 * 1024
    ds = deepseek(sparse=True)
    assert arch.full_block_bytes(ds, 64) == pytest.approx(2.56e6, rel=0.01)


def test_linear_flops_match_public_facts(qwen: ModelSpec, deepseek: Callable[..., ModelSpec]) -> None:
    qwen_gflop = arch.linear_flops_per_token_all_layers(qwen) / 1e9
    assert qwen_gflop == pytest.approx(62, rel=0.02)
    ds_gflop = arch.linear_flops_per_token_all_layers(deepseek(sparse=False)) / 1e9
    assert ds_gflop == pytest.approx(71, rel=0.02)
    assert arch.lm_head_flops_per_token(qwen) / 1e9 == pytest.approx(1.6, rel=0.03)
    assert arch.lm_head_flops_per_token(deepseek(sparse=False)) / 1e9 == pytest.approx(1.9, rel=0.03)


def test_dense_and_moe_layers_differ_in_deepseek(deepseek: Callable[..., ModelSpec]) -> None:
    m = deepseek(sparse=False)
    assert arch.is_moe_layer(m, 3) and not arch.is_moe_layer(m, 2)
    dense, moe = arch.linear_flops_per_token(m, 0), arch.linear_flops_per_token(m, 3)
    assert dense != moe


def test_deepseek_v3_total_params_about_671b(deepseek: Callable[..., ModelSpec]) -> None:
    # DeepSeek-V3 report: 671B main-model weights (the 14B MTP module is extra), 37B active.
    m = deepseek(sparse=False)
    assert arch.total_params(m) / 1e9 == pytest.approx(671, rel=0.01)
    assert arch.active_params_per_token(m) / 1e9 == pytest.approx(37, rel=0.05)


def test_gqa_attention_flops_closed_form(qwen: ModelSpec) -> None:
    m = qwen
    p, n = 1000, 10
    assert arch.attention_flops(m, p, n) == 4 * 40 * 128 * (n * p + n * (n + 1) // 2)


@given(st.integers(0, 5000), st.integers(1, 500), st.integers(0, 3000))
def test_causal_key_count_matches_brute_force(p: int, n: int, cap: int) -> None:
    expected = sum(min(p + i, cap) if cap > 0 else p + i for i in range(1, n + 1))
    assert arch.causal_key_count(p, n, cap) == expected


def test_sparse_attention_caps_main_keys_but_indexer_sees_all(deepseek: Callable[..., ModelSpec]) -> None:
    m = deepseek(sparse=True, absorbed=False)
    a = m.attention
    p, n = 60000, 100
    main = (2 * 128 * 192 + 2 * 128 * 128) * n * 2048
    indexer = 2 * 64 * 128 * (n * p + n * (n + 1) // 2)
    assert arch.attention_flops(m, p, n) == main + indexer
    assert a.sparse_top_k_tokens == 2048


def test_absorbed_mla_prefill_uses_latent_width(deepseek: Callable[..., ModelSpec]) -> None:
    m = deepseek(sparse=False, absorbed=True)
    assert arch.attention_flops(m, 0, 1) == 2 * 128 * 576 + 2 * 128 * 512


def test_decode_attention_flops_mla_absorbed(deepseek: Callable[..., ModelSpec]) -> None:
    m = deepseek(sparse=False)
    assert arch.decode_attention_flops(m, 1000) == 1000 * (2 * 128 * 576 + 2 * 128 * 512)
    sparse = deepseek(sparse=True)
    assert arch.decode_attention_flops(sparse, 100_000) == 2048 * (2 * 128 * 576 + 2 * 128 * 512) + (
        100_000 * 2 * 64 * 128
    )


def test_prefill_flops_sums_layers_and_one_lm_head_token(qwen: ModelSpec) -> None:
    m = qwen
    expected = (
        429 * arch.linear_flops_per_token_all_layers(m)
        + 64 * arch.attention_flops(m, 16384, 429)
        + arch.lm_head_flops_per_token(m)
    )
    assert arch.prefill_flops(m, 16384, 429) == pytest.approx(expected)


def test_unknown_kv_format_is_an_error_naming_it(qwen: ModelSpec) -> None:
    m = dataclasses.replace(qwen, kv_cache_format="int3")
    with pytest.raises(ValueError, match="int3"):
        arch.kv_bytes_per_token_per_layer(m)
