"""An in-memory `KVStore` for tests and for runs that need no persistence."""

from __future__ import annotations

from dualpath.kvcache.index import BlockMeta, LruEviction
from dualpath.kvcache.keys import BlockKey
from dualpath.kvcache.store import BlockMissingError, IndexedStore


class MemoryStore(IndexedStore):
    def __init__(self, capacity_bytes: int, eviction: LruEviction | None = None) -> None:
        super().__init__(capacity_bytes, eviction)
        self._blocks: dict[BlockKey, bytes] = {}

    def _write(self, key: BlockKey, parent: BlockKey, num_layers: int, data: memoryview) -> BlockMeta:
        self._blocks[key] = bytes(data)
        return BlockMeta(
            key=key, parent=parent, num_layers=num_layers, layer_block_bytes=data.nbytes // num_layers
        )

    def _read_into(self, meta: BlockMeta, first_layer: int, num_layers: int, out: memoryview) -> None:
        block = self._blocks.get(meta.key)
        if block is None:
            raise BlockMissingError(meta.key.hex())
        start = first_layer * meta.layer_block_bytes
        out[:] = block[start : start + out.nbytes]

    def _drop(self, key: BlockKey) -> None:
        self._blocks.pop(key, None)
