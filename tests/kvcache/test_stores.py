import os
from pathlib import Path

import numpy as np
import pytest

from dualpath.kvcache import (
    BlockLayout,
    BlockMissingError,
    CorruptBlockError,
    FileStore,
    MemoryStore,
    block_keys,
)
from dualpath.kvcache.file_store import data_offset_bytes

LAYOUT = BlockLayout(num_layers=4, block_tokens=8, bytes_per_token_per_layer=16)


def make_blocks(n: int, seed: int = 0, first_token: int = 0):
    """n chained (key, parent, full block as a [layers, tokens, bytes] uint8 array)."""
    rng = np.random.default_rng(seed)
    keys = block_keys(list(range(first_token, first_token + n * LAYOUT.block_tokens)), LAYOUT.block_tokens)
    shape = (LAYOUT.num_layers, LAYOUT.block_tokens, LAYOUT.bytes_per_token_per_layer)
    parents = [b"\0" * 16, *keys[:-1]]
    return [(k, p, rng.integers(0, 256, shape, dtype=np.uint8)) for k, p in zip(keys, parents, strict=True)]


def put_all(store, blocks):
    for key, parent, data in blocks:
        store.put_full_block(key, data, num_layers=LAYOUT.num_layers, parent=parent)
        store.check_invariants()


@pytest.fixture(params=["memory", "file"])
def store(request, tmp_path):
    cap = 100 * LAYOUT.full_block_bytes
    return MemoryStore(cap) if request.param == "memory" else FileStore(tmp_path, cap)


def test_layer_blocks_round_trip_as_slices_of_the_full_block(store):
    blocks = make_blocks(3)
    put_all(store, blocks)
    for key, _, data in blocks:
        assert store.read_full_block(key) == data.tobytes()
        for layer in range(LAYOUT.num_layers):
            assert store.read_layer_block(key, layer) == data.tobytes()[LAYOUT.layer_slice(layer)]
            assert store.read_layer_block(key, layer) == data[layer].tobytes()
    out = memoryview(bytearray(LAYOUT.layer_block_bytes + 5))
    assert store.read_layer_block_into(blocks[0][0], 2, out) == LAYOUT.layer_block_bytes
    assert bytes(out[: LAYOUT.layer_block_bytes]) == blocks[0][2][2].tobytes()


def test_hit_blocks_and_stats(store):
    blocks = make_blocks(5)
    put_all(store, blocks[:3])
    keys = [k for k, _, _ in blocks]
    assert store.hit_blocks(keys) == 3
    assert not store.put_full_block(keys[0], blocks[0][2], num_layers=LAYOUT.num_layers)
    store.read_layer_block(keys[1], 0)
    with pytest.raises(BlockMissingError):
        store.read_full_block(keys[4])
    s = store.stats()
    assert (s.hit_blocks, s.num_blocks, s.bytes_read) == (3, 3, LAYOUT.layer_block_bytes)
    assert s.bytes_written == 3 * LAYOUT.full_block_bytes and s.miss_blocks == 3
    assert store.delete(keys[2]) and store.hit_blocks(keys) == 2


def test_eviction_trims_chains_from_the_tail_and_stays_under_capacity(tmp_path):
    store = FileStore(tmp_path, 4 * LAYOUT.full_block_bytes)
    old, new = make_blocks(3, seed=1), make_blocks(3, seed=2, first_token=10_000)
    put_all(store, old)
    put_all(store, new)  # only leaves go: the old chain loses its tail, never a block in the middle
    s = store.stats()
    assert s.used_bytes <= store.capacity_bytes and s.num_blocks == 4 and s.evicted_blocks == 2
    assert store.hit_blocks([k for k, _, _ in old]) == 1
    assert store.hit_blocks([k for k, _, _ in new]) == 3
    assert len(list(tmp_path.rglob("*.kvb"))) == 4


def test_eviction_picks_the_least_recently_used_leaf():
    store = MemoryStore(2 * LAYOUT.full_block_bytes)
    a, b, c = (make_blocks(1, first_token=t)[0] for t in (0, 100, 200))
    put_all(store, [a, b])
    store.hit_blocks([a[0]])  # a is now more recent than b
    put_all(store, [c])
    assert store.contains(a[0]) and not store.contains(b[0]) and store.contains(c[0])


def test_block_larger_than_capacity_is_refused():
    with pytest.raises(ValueError):
        MemoryStore(10).put_full_block(b"k" * 16, bytes(40), num_layers=4)
    with pytest.raises(ValueError):
        MemoryStore(100).put_full_block(b"k" * 16, bytes(10), num_layers=4)


def _flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_flipped_byte_raises_corrupt_block_error_and_drops_the_block(tmp_path):
    store = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes)
    (key, parent, data), *_ = make_blocks(1)
    store.put_full_block(key, data, num_layers=LAYOUT.num_layers, parent=parent)
    layer = 2
    _flip_byte(
        store.path_of(key), data_offset_bytes(LAYOUT.num_layers) + layer * LAYOUT.layer_block_bytes + 3
    )
    assert store.read_layer_block(key, 1) == data[1].tobytes()  # other layers still verify
    with pytest.raises(CorruptBlockError):
        store.read_layer_block(key, layer)
    assert store.stats().corrupt_blocks == 1
    assert not store.contains(key) and not store.path_of(key).exists()
    assert store.put_full_block(
        key, data, num_layers=LAYOUT.num_layers, parent=parent
    )  # recomputed, rewritten
    assert store.read_full_block(key) == data.tobytes()


def test_corrupt_header_is_dropped_on_reopen(tmp_path):
    store = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes)
    put_all(store, make_blocks(2))
    victim = make_blocks(2)[1][0]
    _flip_byte(store.path_of(victim), 20)
    reopened = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes)
    assert reopened.stats().num_blocks == 1 and reopened.stats().corrupt_blocks == 1


def test_index_is_rebuilt_after_reopen(tmp_path):
    blocks = make_blocks(4)
    put_all(FileStore(tmp_path, 10 * LAYOUT.full_block_bytes), blocks)
    reopened = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes)
    reopened.check_invariants()
    assert reopened.hit_blocks([k for k, _, _ in blocks]) == 4
    assert reopened.read_layer_block(blocks[3][0], 3) == blocks[3][2][3].tobytes()


def test_leftover_temp_file_from_a_crash_is_ignored_and_cleaned(tmp_path):
    blocks = make_blocks(2)
    store = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes)
    put_all(store, blocks[:1])
    torn = store.path_of(blocks[1][0])
    torn.parent.mkdir(exist_ok=True)
    tmp = torn.parent / ("." + torn.name + ".crash.tmp")
    tmp.write_bytes(b"DPKV half a block")
    reopened = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes, stale_tmp_s=3600)
    assert reopened.hit_blocks([k for k, _, _ in blocks]) == 1 and tmp.exists()
    os.utime(tmp, (0, 0))  # make it stale
    FileStore(tmp_path, 10 * LAYOUT.full_block_bytes, stale_tmp_s=3600)
    assert not tmp.exists()


def test_block_written_by_another_store_instance_is_found(tmp_path):
    writer = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes)
    reader = FileStore(tmp_path, 10 * LAYOUT.full_block_bytes)
    blocks = make_blocks(2)
    put_all(writer, blocks)
    assert reader.hit_blocks([k for k, _, _ in blocks]) == 2
    writer.delete(blocks[1][0])
    with pytest.raises(BlockMissingError):
        reader.read_full_block(blocks[1][0])
    reader.check_invariants()
