"""Model specs built in code from the models' public configs, so arch tests do not depend on presets."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dualpath.config.specs import AttentionSpec, FfnSpec, ModelSpec


def _make_qwen25_32b() -> ModelSpec:
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


def _make_deepseek(*, sparse: bool, absorbed: bool = True, kv_cache_format: str = "mla-fp8") -> ModelSpec:
    attention = AttentionSpec(
        kind="mla",
        num_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        sparse_top_k_tokens=2048 if sparse else 0,
        indexer_num_heads=64 if sparse else 0,
        indexer_head_dim=128 if sparse else 0,
        mla_absorbed_prefill=absorbed,
    )
    ffn = FfnSpec(
        intermediate_size=18432,
        num_dense_layers=3,
        num_routed_experts=256,
        num_active_experts=8,
        num_shared_experts=1,
        moe_intermediate_size=2048,
    )
    return ModelSpec(
        name="deepseek-v3.2" if sparse else "deepseek-v3",
        num_layers=61,
        hidden_size=7168,
        vocab_size=129280,
        attention=attention,
        ffn=ffn,
        weight_bytes_per_param=1,
        kv_cache_format=kv_cache_format,
    )


@pytest.fixture
def qwen() -> ModelSpec:
    return _make_qwen25_32b()


@pytest.fixture
def deepseek() -> Callable[..., ModelSpec]:
    """Factory: `deepseek(sparse=True, absorbed=True, kv_cache_format="mla-fp8")`."""
    return _make_deepseek
