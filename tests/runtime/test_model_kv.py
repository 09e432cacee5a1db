"""KV in the Layer Block layout: byte round trips, Full Block offsets, and the paged KV cache."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.runtime.model import (
    PagedKVCache,
    Transformer,
    TransformerConfig,
    full_block_to_bytes,
    layer_block_offset_bytes,
    layer_kv_from_buffer,
    layer_kv_to_bytes,
    unpack_kv,
)


def make_config(**overrides: object) -> TransformerConfig:
    fields: dict[str, object] = dict(
        vocab_size=259,
        hidden_size=64,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)  # type: ignore[arg-type]


def make_kv(config: TransformerConfig, tokens: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, config.kv_row_elems, generator=generator).to(config.torch_dtype)


def test_layer_kv_bytes_round_trip_is_bit_exact_in_every_dtype() -> None:
    for dtype in ("float32", "bfloat16", "float16"):
        config = make_config(dtype=dtype)
        kv = make_kv(config, 64)
        data = layer_kv_to_bytes(kv)
        assert len(data) == 64 * config.kv_bytes_per_token_per_layer
        back = layer_kv_from_buffer(bytes(data), 64, config)
        assert back.dtype == kv.dtype and back.shape == kv.shape
        assert torch.equal(back.view(torch.uint8), kv.view(torch.uint8))


def test_layer_kv_bytes_are_zero_copy_both_ways() -> None:
    config = make_config()
    kv = make_kv(config, 8)
    view = layer_kv_to_bytes(kv)
    kv[0, 0] = 42.0  # the memoryview shares the tensor's storage
    assert layer_kv_from_buffer(view, 8, config)[0, 0] == 42.0
    buffer = bytearray(8 * config.kv_bytes_per_token_per_layer)
    tensor = layer_kv_from_buffer(buffer, 8, config)
    tensor[1, 2] = 7.0  # and a tensor from a bytearray writes through to it
    assert layer_kv_from_buffer(bytes(buffer), 8, config)[1, 2] == 7.0


def test_layer_block_is_a_contiguous_slice_of_its_full_block() -> None:
    config = make_config()
    blocks = [make_kv(config, 16, seed=layer) for layer in range(config.num_layers)]
    full = full_block_to_bytes(blocks)
    assert len(full) == config.num_layers * 16 * config.kv_bytes_per_token_per_layer
    for layer, block in enumerate(blocks):
        offset = layer_block_offset_bytes(layer, 16, config)
        assert torch.equal(layer_kv_from_buffer(full, 16, config, offset_bytes=offset), block)


def test_layer_kv_from_buffer_rejects_a_short_buffer() -> None:
    config = make_config()
    with pytest.raises(ValueError, match="need"):
        layer_kv_from_buffer(bytes(10), 1, config)


def test_kv_rows_pack_k_before_v_for_all_kv_heads() -> None:
    config = make_config()
    model = Transformer.random(config, seed=0)
    kv = model.prefill([1, 2, 3]).kv[0]
    keys, values = unpack_kv(kv, config)
    assert keys.shape == values.shape == (3, config.num_kv_heads, config.head_dim)
    # V of layer 0 for token 0 is a plain projection of the normed embedding: check its place in the row.
    weights = model.weights.layers[0]
    x = model.weights.embed[1]
    x = x / torch.sqrt(x.pow(2).mean() + config.rms_eps)
    torch.testing.assert_close(kv[0, config.kv_dim :], weights.v_w @ x, rtol=1e-5, atol=1e-5)


def test_paged_cache_page_is_a_full_block_and_its_layers_are_layer_blocks() -> None:
    config = make_config()
    cache = PagedKVCache(config, num_pages=4, block_tokens=16)
    layer_kvs = [make_kv(config, 20, seed=layer) for layer in range(config.num_layers)]
    cache.append("a", layer_kvs)
    assert cache.block_table("a") == (0, 1)
    assert cache.full_block("a", 0).shape == (config.num_layers, 16, config.kv_row_elems)
    assert cache.full_block("a", 0).is_contiguous()
    for layer in range(config.num_layers):
        block = cache.layer_block("a", 1, layer)
        assert block.is_contiguous()
        assert torch.equal(block[:4], layer_kvs[layer][16:])
        assert torch.equal(cache.read("a", layer), layer_kvs[layer])
    # The page's bytes are exactly the Full Block bytes of the first 16 tokens.
    assert bytes(layer_kv_to_bytes(cache.full_block("a", 0))) == full_block_to_bytes(
        [kv[:16] for kv in layer_kvs]
    )


def test_paged_cache_capacity_and_refusal() -> None:
    config = make_config()
    cache = PagedKVCache.for_memory(
        config, memory_bytes=3.5 * 3 * 16 * config.kv_bytes_per_token_per_layer, block_tokens=16
    )
    assert cache.num_pages == 3 and cache.free_tokens == 48
    assert cache.can_allocate("a", 33) and not cache.can_allocate("a", 49)
    cache.allocate("a", 17)
    assert cache.free_tokens == 16
    assert cache.can_allocate("a", 15)  # fills the slack of page 2 and one new page
    assert not cache.can_allocate("b", 17)
    with pytest.raises(MemoryError):
        cache.allocate("b", 17)
    cache.check_invariants()
    cache.free("a")
    assert cache.free_tokens == 48
    cache.check_invariants()


def test_decode_step_paged_equals_decode_over_plain_tensors() -> None:
    config = make_config()
    model = Transformer.random(config, seed=0)
    cache = PagedKVCache(config, num_pages=16, block_tokens=8)
    prompts = {"a": [5, 6, 7], "b": list(range(20)), "c": [9] * 8}
    for seq_id, ids in prompts.items():
        cache.append(seq_id, model.prefill(ids).kv)
    contexts = [[kv for kv in model.prefill(ids).kv] for ids in prompts.values()]
    expected = model.decode_step([1, 2, 3], contexts)
    logits = model.decode_step_paged(cache, list(prompts), [1, 2, 3])
    assert torch.equal(logits, expected.logits)
    assert cache.num_tokens("c") == 9 and len(cache.block_table("c")) == 2
    assert torch.equal(cache.read("b", 2)[-1], expected.kv[2][1])
    cache.check_invariants()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 4), st.integers(0, 40)), max_size=30
    )
)
def test_paged_cache_invariants_hold_under_random_allocate_and_free(ops: list[tuple[str, int, int]]) -> None:
    config = make_config(num_layers=1, num_kv_heads=1, num_heads=1, hidden_size=16, head_dim=2)
    cache = PagedKVCache(config, num_pages=10, block_tokens=8)
    lengths: dict[int, int] = {}
    for op, seq_id, tokens in ops:
        if op == "alloc":
            if cache.can_allocate(seq_id, tokens):
                start = cache.allocate(seq_id, tokens)
                assert start == lengths.get(seq_id, 0)
                lengths[seq_id] = start + tokens
                # Fill the new slots with the positions, so that reads can be checked.
                rows = torch.arange(start, start + tokens, dtype=torch.float32)[:, None].expand(tokens, 4)
                cache.write(seq_id, 0, start, rows)
        elif seq_id in lengths:
            cache.free(seq_id)
            del lengths[seq_id]
        cache.check_invariants()
        used_pages = sum(-(-length // 8) for length in lengths.values())
        assert cache.num_free_pages == 10 - used_pages
        for live, length in lengths.items():
            assert torch.equal(cache.read(live, 0)[:, 0], torch.arange(length, dtype=torch.float32))


def test_paged_decode_gathers_the_same_key_tiles_over_reused_pages_and_tile_boundaries() -> None:
    """The paged decode gathers each context straight into attention's key tiles: a page reused after a
    freed sequence (its slots past the new owner's tokens hold old rows) and contexts ending on a page or a
    128-token tile boundary still give the bits of decoding over plain tensors."""
    config = make_config()
    model = Transformer.random(config, seed=0)
    cache = PagedKVCache(config, num_pages=64, block_tokens=16)
    cache.append("old", model.prefill([7] * 300).kv)  # fills pages with rows, then leaves them stale
    cache.free("old")
    prompts = {n: [(3 * n + i) % config.vocab_size for i in range(n)] for n in (16, 127, 128, 129, 200)}
    for n, ids in prompts.items():
        cache.append(n, model.prefill(ids).kv)
    contexts = [list(model.prefill(ids).kv) for ids in prompts.values()]
    expected = model.decode_step([1, 2, 3, 4, 5], contexts)
    assert torch.equal(model.decode_step_paged(cache, list(prompts), [1, 2, 3, 4, 5]), expected.logits)
    for index, n in enumerate(prompts):
        assert torch.equal(cache.read(n, 1)[-1], expected.kv[1][index])
    cache.check_invariants()
