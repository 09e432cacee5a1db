"""The `KVStore` protocol and the part every store shares: index, eviction, stats, error handling.

A store holds Full Blocks and serves Full or Layer Blocks. Concrete stores implement four small hooks
(`_probe`, `_write`, `_read_into`, `_drop`); everything about *which* block lives or dies is here, so
`MemoryStore` and `FileStore` cannot drift apart.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dualpath.kvcache.index import BlockMeta, LruEviction, PrefixIndex
from dualpath.kvcache.keys import ROOT_KEY, BlockKey, key_hex

Buffer = bytes | bytearray | memoryview  # numpy arrays are accepted too (any C-contiguous buffer)


class BlockMissingError(KeyError):
    """The block is not in the store (never written, evicted, or deleted by another process)."""


class CorruptBlockError(Exception):
    """A block failed its checksum (or its header is unreadable); the store has dropped it.

    The caller treats the block as a miss and recomputes it (DESIGN §4 "faults")."""

    def __init__(self, key: BlockKey, why: str) -> None:
        super().__init__(f"block {key_hex(key)} is corrupt: {why}")
        self.key = key


@dataclass(frozen=True, kw_only=True)
class StoreStats:
    bytes_read: int = 0
    bytes_written: int = 0
    hit_blocks: int = 0  # blocks found by hit_blocks() queries
    miss_blocks: int = 0  # blocks found absent by a query or a read
    corrupt_blocks: int = 0
    evicted_blocks: int = 0
    evicted_bytes: int = 0
    num_blocks: int = 0
    used_bytes: int = 0


class KVStore(Protocol):
    capacity_bytes: int

    @property
    def used_bytes(self) -> int: ...
    def put_full_block(
        self, key: BlockKey, data: Buffer, *, num_layers: int, parent: BlockKey | None = None
    ) -> bool: ...
    def read_layer_block(self, key: BlockKey, layer: int) -> bytes: ...
    def read_layer_block_into(self, key: BlockKey, layer: int, out: memoryview) -> int: ...
    def read_full_block(self, key: BlockKey) -> bytes: ...
    def read_full_block_into(self, key: BlockKey, out: memoryview) -> int: ...
    def block_meta(self, key: BlockKey) -> BlockMeta: ...
    def contains(self, key: BlockKey) -> bool: ...
    def forget(self, key: BlockKey) -> bool: ...
    def hit_blocks(self, keys: Sequence[BlockKey]) -> int: ...
    def delete(self, key: BlockKey) -> bool: ...
    def stats(self) -> StoreStats: ...


def as_byte_view(data: Buffer) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("block data must be a C-contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class IndexedStore:
    """Shared logic of the stores. Subclasses implement the hooks at the bottom.

    Locking: the index and counters change under `_lock`; block I/O runs outside it so reads proceed in
    parallel (the StorageReader keeps several in flight)."""

    def __init__(self, capacity_bytes: int, eviction: LruEviction | None = None) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._index = PrefixIndex()
        self._eviction = eviction or LruEviction()
        self._lock = threading.Lock()
        self._counts = {f: 0 for f in ("bytes_read", "bytes_written", "hit_blocks", "miss_blocks")}
        self._counts |= {"corrupt_blocks": 0, "evicted_blocks": 0, "evicted_bytes": 0}

    # ---- public API -------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._index.used_bytes

    def put_full_block(
        self, key: BlockKey, data: Buffer, *, num_layers: int, parent: BlockKey | None = None
    ) -> bool:
        """Store a Full Block; False when the key is already present (content-addressed, so no rewrite)."""
        view = as_byte_view(data)
        if num_layers <= 0 or view.nbytes == 0 or view.nbytes % num_layers:
            raise ValueError(f"{view.nbytes} bytes do not split into {num_layers} equal Layer Blocks")
        if view.nbytes > self.capacity_bytes:
            raise ValueError(f"a {view.nbytes}-byte block exceeds the capacity {self.capacity_bytes}")
        if self.contains(key):
            return False
        meta = self._write(key, parent or ROOT_KEY, num_layers, view)
        with self._lock:
            if key in self._index:
                return False
            self._index.insert(meta)
            self._counts["bytes_written"] += view.nbytes
            self._evict_until_fits(keep=key)
        return True

    def read_layer_block(self, key: BlockKey, layer: int) -> bytes:
        out = bytearray(self.block_meta(key).layer_block_bytes)
        self.read_layer_block_into(key, layer, memoryview(out))
        return bytes(out)

    def read_layer_block_into(self, key: BlockKey, layer: int, out: memoryview) -> int:
        meta = self.block_meta(key)
        if not 0 <= layer < meta.num_layers:
            raise IndexError(f"layer {layer} outside [0, {meta.num_layers}) of block {key_hex(key)}")
        return self._guarded_read(meta, layer, 1, out)

    def read_full_block(self, key: BlockKey) -> bytes:
        out = bytearray(self.block_meta(key).full_block_bytes)
        self.read_full_block_into(key, memoryview(out))
        return bytes(out)

    def read_full_block_into(self, key: BlockKey, out: memoryview) -> int:
        meta = self.block_meta(key)
        return self._guarded_read(meta, 0, meta.num_layers, out)

    def block_meta(self, key: BlockKey) -> BlockMeta:
        with self._lock:
            meta = self._lookup(key)
            if meta is None:
                self._counts["miss_blocks"] += 1
                raise BlockMissingError(key_hex(key))
            self._index.touch(key)
            return meta

    def contains(self, key: BlockKey) -> bool:
        """Whether the block is stored. An indexed block whose data is gone (another process found it
        corrupt and dropped it, or it was deleted) leaves the index here, so a writer stores it again."""
        with self._lock:
            if self._lookup(key) is None:
                return False
            if self._present(key):
                return True
            self._index.remove(key)
            self._counts["miss_blocks"] += 1
            return False

    def forget(self, key: BlockKey) -> bool:
        """Drop a block from this process's index only, leaving its data alone: another process found it
        corrupt or missing. If its data is still (or again) stored, the next lookup finds it again."""
        with self._lock:
            if key not in self._index:
                return False
            self._index.remove(key)
            return True

    def hit_blocks(self, keys: Sequence[BlockKey]) -> int:
        """Leading whole blocks of `keys` present; counts as a use of each hit block (LRU)."""
        with self._lock:
            n = 0
            for key in keys:
                if self._lookup(key) is None:
                    break
                self._index.touch(key)
                n += 1
            self._counts["hit_blocks"] += n
            self._counts["miss_blocks"] += len(keys) - n
            return n

    def delete(self, key: BlockKey) -> bool:
        with self._lock:
            if self._lookup(key) is None:
                return False
            self._index.remove(key)
            self._drop(key)
            return True

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(**self._counts, num_blocks=len(self._index), used_bytes=self._index.used_bytes)

    def check_invariants(self) -> None:
        with self._lock:
            self._index.check_invariants()
            assert self._index.used_bytes <= self.capacity_bytes

    # ---- shared internals -------------------------------------------------------------------
    def _lookup(self, key: BlockKey) -> BlockMeta | None:
        meta = self._index.get(key)
        if meta is None:
            meta = self._probe(key)
            if meta is not None:
                self._index.insert(meta)
                self._evict_until_fits(keep=key)
        return meta

    def _guarded_read(self, meta: BlockMeta, first_layer: int, num_layers: int, out: memoryview) -> int:
        need = num_layers * meta.layer_block_bytes
        if out.nbytes < need:
            raise ValueError(f"output buffer holds {out.nbytes} bytes, the read needs {need}")
        try:
            self._read_into(meta, first_layer, num_layers, out[:need])
        except CorruptBlockError:
            self._forget(meta.key, corrupt=True)
            raise
        except BlockMissingError:
            self._forget(meta.key, corrupt=False)
            raise
        with self._lock:
            self._counts["bytes_read"] += need
        return need

    def _forget(self, key: BlockKey, *, corrupt: bool) -> None:
        with self._lock:
            self._counts["corrupt_blocks" if corrupt else "miss_blocks"] += 1
            if key in self._index:
                self._index.remove(key)
            self._drop(key)

    def _evict_until_fits(self, *, keep: BlockKey) -> None:
        while self._index.used_bytes > self.capacity_bytes:
            candidates = [c for c in self._index.leaves() if c[0] != keep]
            if not candidates:
                return
            victim = self._eviction.choose_victim(candidates)
            meta = self._index.remove(victim)
            self._drop(victim)
            self._counts["evicted_blocks"] += 1
            self._counts["evicted_bytes"] += meta.full_block_bytes

    # ---- hooks ------------------------------------------------------------------------------
    def _probe(self, key: BlockKey) -> BlockMeta | None:
        """A block this store holds but has not indexed yet (written by another process), or None."""
        return None

    def _present(self, key: BlockKey) -> bool:
        """Whether an indexed block's data still exists (a store shared with other processes may lose it)."""
        return True

    def _write(self, key: BlockKey, parent: BlockKey, num_layers: int, data: memoryview) -> BlockMeta:
        raise NotImplementedError

    def _read_into(self, meta: BlockMeta, first_layer: int, num_layers: int, out: memoryview) -> None:
        raise NotImplementedError

    def _drop(self, key: BlockKey) -> None:
        raise NotImplementedError
