import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath.kvcache import ROOT_KEY, BlockLayout, BlockMeta, LruEviction, PrefixIndex, block_keys, key_hex

BLOCK = 4


def make_meta(key: bytes, parent: bytes = ROOT_KEY, layers: int = 2, layer_bytes: int = 8) -> BlockMeta:
    return BlockMeta(key=key, parent=parent, num_layers=layers, layer_block_bytes=layer_bytes)


def test_same_prefix_gives_same_keys():
    a = block_keys(list(range(20)), BLOCK)
    b = block_keys(list(range(16)) + [99, 98, 97, 96], BLOCK)
    assert len(a) == 5 and a[:4] == b[:4] and a[4] != b[4]


@given(st.lists(st.integers(0, 2**31), min_size=BLOCK, max_size=40), st.data())
def test_changing_one_token_changes_its_block_and_all_later_keys(tokens, data):
    pos = data.draw(st.integers(0, len(tokens) - 1))
    changed = list(tokens)
    changed[pos] += 1
    a, b = block_keys(tokens, BLOCK), block_keys(changed, BLOCK)
    first = pos // BLOCK
    assert a[:first] == b[:first]
    assert all(x != y for x, y in zip(a[first:], b[first:], strict=True))


def test_partial_block_has_no_key_and_chains_continue():
    tokens = list(range(11))
    keys = block_keys(tokens, BLOCK)
    assert len(keys) == 2
    assert block_keys(tokens[4:8], BLOCK, parent=keys[0]) == keys[1:]
    assert len(key_hex(keys[0])) == 32


def test_keys_depend_on_block_size_boundaries():
    assert block_keys(list(range(8)), 4)[1] != block_keys(list(range(8)), 8)[0]


def test_layer_block_is_a_slice_of_the_full_block():
    layout = BlockLayout(num_layers=3, block_tokens=4, bytes_per_token_per_layer=5)
    assert layout.layer_block_bytes == 20 and layout.full_block_bytes == 60
    full = np.arange(60, dtype=np.uint8).reshape(3, 4, 5)
    assert bytes(full[1:2]) == bytes(full)[layout.layer_slice(1)]
    with pytest.raises(IndexError):
        layout.layer_offset_bytes(3)


def test_hit_length_counts_leading_whole_blocks():
    keys = block_keys(list(range(40)), BLOCK)
    index = PrefixIndex()
    parent = ROOT_KEY
    for k in keys[:6]:
        index.insert(make_meta(k, parent))
        parent = k
        index.check_invariants()
    assert index.hit_blocks(keys) == 6
    other = block_keys(list(range(12)) + [7] * 28, BLOCK)
    assert index.hit_blocks(other) == 3


def test_only_leaves_are_evictable_and_lru_picks_oldest():
    a, b, c = (bytes([i]) * 16 for i in (1, 2, 3))
    index = PrefixIndex()
    index.insert(make_meta(a))
    index.insert(make_meta(b, a))
    index.insert(make_meta(c))
    assert not index.can_remove(a) and index.can_remove(b) and index.can_remove(c)
    assert not index.can_insert(make_meta(a))
    index.touch(b)
    assert LruEviction().choose_victim(index.leaves()) == c
    index.remove(b)
    index.check_invariants()
    assert index.can_remove(a) and index.used_bytes == 32
