"""The node's DRAM buffer (PE buffer / DE buffer, paper §2 and A.4): regions of one registered buffer.

A request's staging region is layer-major, so a layer's KV is one contiguous slice (one transfer per layer,
no relayout; storage Layer Blocks land at their token offset)::

    region = [layer 0: tokens x bytes_per_token_per_layer][layer 1: ...] ... [layer L-1: ...]

First-fit over a sorted free list: requests are few (tens) and regions large, so a list beats a buddy
allocator in clarity; `check_invariants` keeps it honest. A full buffer is backpressure — the caller
waits and retries (DESIGN "faults"), never an error.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

_ALIGN_BYTES = 64  # cache-line alignment, so torch.frombuffer views start aligned


@dataclass(frozen=True, kw_only=True)
class Region:
    offset_bytes: int
    nbytes: int
    num_layers: int
    tokens: int

    @property
    def layer_bytes(self) -> int:
        return self.nbytes // self.num_layers if self.num_layers else 0

    def layer_offset_bytes(self, layer: int) -> int:
        return self.offset_bytes + layer * self.layer_bytes


class DramBuffer:
    """Allocator of regions inside a buffer of `capacity_bytes` (thread-safe)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._free: list[tuple[int, int]] = [(0, capacity_bytes)]  # (offset, size), sorted by offset
        self._used: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._used.values())

    def allocate(self, *, num_layers: int, tokens: int, bytes_per_token_per_layer: int) -> Region | None:
        """A region for `tokens` of every layer, or None when the buffer has no room now."""
        layer_bytes = tokens * bytes_per_token_per_layer
        layer_bytes += -layer_bytes % _ALIGN_BYTES
        nbytes = max(layer_bytes * num_layers, _ALIGN_BYTES)
        with self._lock:
            for i, (offset, size) in enumerate(self._free):
                if size >= nbytes:
                    rest = (offset + nbytes, size - nbytes)
                    self._free[i : i + 1] = [rest] if rest[1] else []
                    self._used[offset] = nbytes
                    return Region(offset_bytes=offset, nbytes=nbytes, num_layers=num_layers, tokens=tokens)
        return None

    def free(self, region: Region) -> None:
        with self._lock:
            size = self._used.pop(region.offset_bytes)
            self._free.append((region.offset_bytes, size))
            self._free.sort()
            merged: list[tuple[int, int]] = []
            for offset, length in self._free:
                if merged and merged[-1][0] + merged[-1][1] == offset:
                    merged[-1] = (merged[-1][0], merged[-1][1] + length)
                else:
                    merged.append((offset, length))
            self._free = merged

    def check_invariants(self) -> None:
        with self._lock:
            spans = sorted([*self._free, *self._used.items()])
            position = 0
            for offset, size in spans:
                assert offset == position and size > 0, f"gap or overlap at {offset}"
                position = offset + size
            assert position == self.capacity_bytes
