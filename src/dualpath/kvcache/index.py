"""The prefix index: a trie of Full Blocks keyed by chained block keys (paper §4.1).

Why a trie and not a flat set: keys are chained, so a flat set already answers "is this prefix cached",
but eviction must not punch holes. A block whose descendants are cached is worth keeping (dropping it
would strand them), so only leaves are evicted. Each node records its parent key; `_children` counts the
cached children per key (also for a parent that is itself absent, so counts survive any insert order).
Recency is a use sequence number passed through `touch`, never a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from dualpath.kvcache.keys import ROOT_KEY, BlockKey


@dataclass(frozen=True, kw_only=True)
class BlockMeta:
    """What the index knows about one cached Full Block."""

    key: BlockKey
    parent: BlockKey  # ROOT_KEY for the first block of a sequence (or an unknown parent)
    num_layers: int
    layer_block_bytes: int
    layer_crc32s: tuple[int, ...] = ()  # one per Layer Block; empty where the store keeps no checksums

    @property
    def full_block_bytes(self) -> int:
        return self.num_layers * self.layer_block_bytes


class LruEviction:
    """Evict the least recently used leaf; ties broken by key so runs are deterministic."""

    def choose_victim(self, candidates: Iterable[tuple[BlockKey, int]]) -> BlockKey:
        return min(candidates, key=lambda c: (c[1], c[0]))[0]


class PrefixIndex:
    def __init__(self) -> None:
        self._meta: dict[BlockKey, BlockMeta] = {}
        self._last_use: dict[BlockKey, int] = {}
        self._children: dict[BlockKey, int] = {}
        self._use_seq = 0
        self._used_bytes = 0

    def __len__(self) -> int:
        return len(self._meta)

    def __contains__(self, key: object) -> bool:
        return key in self._meta

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def get(self, key: BlockKey) -> BlockMeta | None:
        return self._meta.get(key)

    def hit_blocks(self, keys: Sequence[BlockKey]) -> int:
        """Number of leading blocks of `keys` that are cached (the hit length in whole blocks)."""
        n = 0
        for key in keys:
            if key not in self._meta:
                break
            n += 1
        return n

    def can_insert(self, meta: BlockMeta) -> bool:
        return meta.key not in self._meta

    def insert(self, meta: BlockMeta) -> None:
        assert self.can_insert(meta), "block already indexed"
        self._meta[meta.key] = meta
        self._children[meta.parent] = self._children.get(meta.parent, 0) + 1
        self._used_bytes += meta.full_block_bytes
        self.touch(meta.key)

    def can_remove(self, key: BlockKey) -> bool:
        """A block may be evicted only when it is a leaf (no cached children)."""
        return key in self._meta and self._children.get(key, 0) == 0

    def remove(self, key: BlockKey) -> BlockMeta:
        """Drop a block. Removing an inner block is allowed (corruption, explicit delete): its children
        stay, unreachable by `hit_blocks` until the block is written again."""
        meta = self._meta.pop(key)
        del self._last_use[key]
        left = self._children[meta.parent] - 1
        if left:
            self._children[meta.parent] = left
        else:
            del self._children[meta.parent]
        self._used_bytes -= meta.full_block_bytes
        return meta

    def touch(self, key: BlockKey) -> None:
        self._use_seq += 1
        self._last_use[key] = self._use_seq

    def leaves(self) -> Iterator[tuple[BlockKey, int]]:
        """(key, last use) of every evictable block, in key order."""
        for key in sorted(self._meta):
            if self._children.get(key, 0) == 0:
                yield key, self._last_use[key]

    def check_invariants(self) -> None:
        assert set(self._last_use) == set(self._meta)
        assert self._used_bytes == sum(m.full_block_bytes for m in self._meta.values())
        counts: dict[BlockKey, int] = {}
        for meta in self._meta.values():
            counts[meta.parent] = counts.get(meta.parent, 0) + 1
        assert counts == self._children, "child counts out of step with parents"
        assert ROOT_KEY not in self._meta, "the root is not a block"
