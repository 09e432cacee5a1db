"""The decoder: correct against a plain PyTorch oracle, and batch-invariant across every path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.architecture import arch
from dualpath.config.loader import load_model
from dualpath.config.specs import AttentionSpec, FfnSpec, ModelSpec
from dualpath.runtime.model import ByteTokenizer, Transformer, TransformerConfig, config_from_model_spec


def make_config(**overrides: object) -> TransformerConfig:
    fields: dict[str, object] = dict(
        vocab_size=259,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_tokens=1024,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)  # type: ignore[arg-type]


def make_ids(count: int, seed: int = 0, vocab: int = 259) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count,), generator=generator).tolist()


def oracle_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """Textbook Llama forward with stock PyTorch ops (rsqrt RMSNorm, SDPA, F.silu)."""
    config, weights = model.config, model.weights
    tokens, d = len(ids), config.head_dim

    def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_eps) * w

    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.outer(torch.arange(tokens, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().float(), angles.sin().float()

    def rope(x: torch.Tensor) -> torch.Tensor:  # [heads, tokens, d]
        rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * cos + rotated * sin

    x = weights.embed[torch.tensor(ids)]
    group = config.num_heads // config.num_kv_heads
    for w in weights.layers:
        h = norm(x, w.input_norm)
        q = rope(F.linear(h, w.q_w, w.q_b).view(tokens, -1, d).transpose(0, 1))
        k = rope(F.linear(h, w.k_w, w.k_b).view(tokens, -1, d).transpose(0, 1))
        v = F.linear(h, w.v_w, w.v_b).view(tokens, -1, d).transpose(0, 1)
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.linear(attention.transpose(0, 1).reshape(tokens, -1), w.o_w)
        h = norm(x, w.post_norm)
        x = x + F.linear(F.silu(F.linear(h, w.gate_w)) * F.linear(h, w.up_w), w.down_w)
    return F.linear(norm(x, weights.final_norm), weights.lm_head)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_prefill_matches_textbook_llama_forward(qkv_bias: bool) -> None:
    model = Transformer.random(make_config(qkv_bias=qkv_bias), seed=1)
    ids = make_ids(300)
    got = model.prefill(ids, all_logits=True).logits
    torch.testing.assert_close(got, oracle_logits(model, ids), rtol=1e-4, atol=1e-4)


def test_layerwise_prefill_equals_full_prefill() -> None:
    model = Transformer.random(make_config(), seed=0)
    ids = make_ids(90)
    hidden = model.embed(ids)
    positions = torch.arange(len(ids))
    layer_kvs = []
    for layer in range(model.config.num_layers):
        hidden, kv = model.prefill_layer(layer, hidden, positions, None)
        layer_kvs.append(kv)
    full = model.prefill(ids, all_logits=True)
    assert torch.equal(model.final(hidden), full.logits)
    assert all(torch.equal(a, b) for a, b in zip(layer_kvs, full.kv, strict=True))


@pytest.mark.parametrize("split", [1, 7, 64, 128, 129, 299])
def test_chunked_prefill_over_cached_prefix_is_bit_identical_to_one_shot(split: int) -> None:
    model = Transformer.random(make_config(), seed=0)
    ids = make_ids(300)
    one_shot = model.prefill(ids, all_logits=True)
    first = model.prefill(ids[:split], all_logits=True)
    second = model.prefill(ids[split:], first.kv, all_logits=True)
    torch.testing.assert_close(
        torch.cat([first.logits, second.logits]), one_shot.logits, rtol=1e-5, atol=1e-5
    )
    # Batch-invariant kernels make it exact, not merely close (numerics.py NOTE).
    assert torch.equal(torch.cat([first.logits, second.logits]), one_shot.logits)
    for layer, kv in enumerate(one_shot.kv):
        assert torch.equal(torch.cat([first.kv[layer], second.kv[layer]]), kv)


def test_decode_batch_of_different_lengths_equals_per_sequence_decode() -> None:
    model = Transformer.random(make_config(), seed=0)
    ids = make_ids(400, seed=2)
    full = model.prefill(ids, all_logits=True)
    lengths = [1, 5, 64, 130, 399]
    contexts = [[kv[:length] for kv in full.kv] for length in lengths]
    tokens = [ids[length] for length in lengths]
    batched = model.decode_step(tokens, contexts)
    for index, (token, context) in enumerate(zip(tokens, contexts, strict=True)):
        alone = model.decode_step([token], [context])
        assert torch.equal(alone.logits[0], batched.logits[index])
        assert all(torch.equal(alone.kv[layer][0], batched.kv[layer][index]) for layer in range(2))
        # ... and a decode step is the same computation as prefilling that one token.
        assert torch.equal(batched.logits[index], full.logits[lengths[index]])


def test_same_seed_same_weights_and_different_seed_different_logits() -> None:
    config, ids = make_config(), make_ids(20)
    a = Transformer.random(config, seed=5).prefill(ids).logits
    b = Transformer.random(config, seed=5).prefill(ids).logits
    c = Transformer.random(config, seed=6).prefill(ids).logits
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_random_model_logits_are_spread_out_for_meaningful_greedy_decoding() -> None:
    logits = Transformer.random(make_config(), seed=0).prefill(make_ids(50), all_logits=True).logits
    top2 = logits.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-4


def test_config_from_the_tiny_llama_preset_agrees_with_the_architecture_math() -> None:
    spec = load_model("tiny-llama")
    config = config_from_model_spec(spec)
    assert config == TransformerConfig.from_model_spec(spec)
    assert (config.num_layers, config.num_kv_heads, config.head_dim, config.intermediate_size) == (
        4,
        4,
        32,
        688,
    )
    assert config.tie_word_embeddings == spec.tied_embeddings
    # The runtime's Layer Block row is the size the simulator and planner assume for this model.
    assert config.kv_bytes_per_token_per_layer == arch.kv_bytes_per_token_per_layer(spec)
    assert config.vocab_size == ByteTokenizer().vocab_size
    bf16 = dataclasses.replace(spec, kv_cache_format="bf16")
    assert config_from_model_spec(bf16).kv_bytes_per_token_per_layer == arch.kv_bytes_per_token_per_layer(
        bf16
    )
    logits = Transformer.random(config, seed=0).prefill(make_ids(10)).logits
    assert logits.shape == (1, spec.vocab_size) and bool(torch.isfinite(logits).all())


def test_config_rejects_moe_and_bad_shapes() -> None:
    moe = ModelSpec(
        name="moe",
        num_layers=2,
        hidden_size=64,
        vocab_size=100,
        attention=AttentionSpec(kind="gqa", num_heads=4, num_kv_heads=2, head_dim=16),
        ffn=FfnSpec(intermediate_size=128, num_routed_experts=8, num_active_experts=2),
        weight_bytes_per_param=2,
        kv_cache_format="bf16",
    )
    with pytest.raises(ValueError, match="MoE"):
        config_from_model_spec(moe)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        make_config(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        make_config(dtype="float8")


def test_prefill_rejects_out_of_vocab_ids_and_overlong_context() -> None:
    model = Transformer.random(make_config(max_position_tokens=32), seed=0)
    with pytest.raises(ValueError, match="token ids"):
        model.prefill([1, 259])
    with pytest.raises(ValueError, match="max_position_tokens"):
        model.prefill(make_ids(33))


@settings(max_examples=8, deadline=None)
@given(
    total=st.integers(2, 400),
    cuts=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3),
    decode_lengths=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
)
def test_any_chunking_and_any_decode_batch_reproduce_the_one_shot_bits(
    total: int, cuts: list[float], decode_lengths: list[float]
) -> None:
    """The runtime's oracle property: however the KV of a token was computed, it is the same bits."""
    model = Transformer.random(make_config(qkv_bias=True), seed=4)
    ids = make_ids(total, seed=total)
    one_shot = model.prefill(ids, all_logits=True)
    bounds = sorted({0, total, *(min(total - 1, max(1, int(c * total))) for c in cuts)})
    kv: list[torch.Tensor] | None = None
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        part = model.prefill(ids[lo:hi], kv, all_logits=True)
        assert torch.equal(part.logits, one_shot.logits[lo:hi])
        kv = list(part.kv) if kv is None else [torch.cat(pair) for pair in zip(kv, part.kv, strict=True)]
    assert kv is not None and all(torch.equal(a, b) for a, b in zip(kv, one_shot.kv, strict=True))
    lengths = [min(total - 1, max(1, int(f * total))) for f in decode_lengths]
    step = model.decode_step(
        [ids[n] for n in lengths], [[layer[:n] for layer in one_shot.kv] for n in lengths]
    )
    for index, n in enumerate(lengths):
        assert torch.equal(step.logits[index], one_shot.logits[n])
