"""A shared store's folder as others may leave it: foreign names, directories, links, lost blocks."""

import logging
import os

from tests.kvcache.test_stores import LAYOUT, make_blocks, put_all

from dualpath.kvcache import FileStore, key_hex


def test_start_up_skips_names_that_are_not_blocks_with_one_warning(tmp_path, caplog):
    blocks = make_blocks(2)
    put_all(FileStore(tmp_path, 10**9), blocks)
    name = key_hex(blocks[0][0])
    (tmp_path / "ab").mkdir(exist_ok=True)
    (tmp_path / "ab" / ("g" * 32 + ".kvb")).write_bytes(b"x")  # not hex
    (tmp_path / name[:2] / ("f" * 32 + ".kvb")).mkdir(parents=True, exist_ok=True)  # wrong fan-out
    other = key_hex(make_blocks(1, seed=3, first_token=500)[0][0])
    (tmp_path / other[:2]).mkdir(exist_ok=True)
    (tmp_path / other[:2] / (other + ".kvb")).mkdir()  # a directory named like a block
    os.symlink(tmp_path / "nowhere", tmp_path / "zz")  # a dangling fan-out folder
    dangling = make_blocks(1, seed=4, first_token=900)[0][0]
    (tmp_path / key_hex(dangling)[:2]).mkdir(exist_ok=True)
    os.symlink(tmp_path / "missing.kvb", tmp_path / key_hex(dangling)[:2] / (key_hex(dangling) + ".kvb"))
    (tmp_path / "README").write_text("not a block")
    with caplog.at_level(logging.WARNING, logger="dualpath.kvcache.file_store"):
        store = FileStore(tmp_path, 10**9)
    assert store.stats().num_blocks == 2
    assert store.hit_blocks([k for k, _, _ in blocks]) == 2
    assert not store.contains(dangling)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "skipped 6 entries" in warnings[0], warnings
    assert store.put_full_block(dangling, blocks[1][2], num_layers=LAYOUT.num_layers) is True
    assert store.path_of(dangling).is_file()  # the link was replaced by the block, its target untouched


def test_a_block_another_process_dropped_is_written_again(tmp_path):
    """The DE's store indexed a block when it wrote it; a PE's read found it corrupt and deleted the
    file. The DE must not skip the rewrite because its own index still lists the block."""
    (key, parent, data), *_ = make_blocks(1)
    writer, reader = FileStore(tmp_path, 10**9), FileStore(tmp_path, 10**9)
    assert writer.put_full_block(key, data, num_layers=LAYOUT.num_layers, parent=parent)
    assert reader.contains(key)
    writer.path_of(key).unlink()  # what the reader's store does on a checksum failure
    assert not writer.contains(key)
    assert writer.put_full_block(key, data, num_layers=LAYOUT.num_layers, parent=parent)
    assert reader.read_full_block(key) == data.tobytes()


def test_forget_drops_only_the_index_entry(tmp_path):
    (key, parent, data), *_ = make_blocks(1)
    store = FileStore(tmp_path, 10**9)
    store.put_full_block(key, data, num_layers=LAYOUT.num_layers, parent=parent)
    assert store.forget(key) and not store.forget(key)
    assert store.path_of(key).is_file() and store.contains(key)  # found again on disk
    store.check_invariants()


def test_an_unreadable_block_is_a_corrupt_one(tmp_path, monkeypatch):
    """EIO on a read: the block is dropped and the reader gets CorruptBlockError (it recomputes)."""
    import errno

    import pytest

    from dualpath.kvcache import CorruptBlockError

    (key, parent, data), *_ = make_blocks(1)
    store = FileStore(tmp_path, 10**9)
    store.put_full_block(key, data, num_layers=LAYOUT.num_layers, parent=parent)

    def preadv(*_args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", preadv)
    with pytest.raises(CorruptBlockError, match="Input/output error"):
        store.read_full_block(key)
    assert not store.contains(key) and store.stats().corrupt_blocks == 1
