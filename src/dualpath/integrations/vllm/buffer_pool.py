"""First-fit allocation of byte ranges in one registered buffer (the prefill node's DRAM buffer, paper §4.1)."""

from __future__ import annotations

import threading


class BufferPool:
    def __init__(self, nbytes: int) -> None:
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, nbytes)] if nbytes else []  # (offset, size), by offset

    def allocate(self, nbytes: int) -> int | None:
        """Offset of a free range of `nbytes`, or None when no range is large enough."""
        with self._lock:
            for i, (offset, size) in enumerate(self._free):
                if size >= nbytes:
                    if size == nbytes:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + nbytes, size - nbytes)
                    return offset
            return None

    def release(self, offset: int, nbytes: int) -> None:
        with self._lock:
            self._free.append((offset, nbytes))
            self._free.sort()
            merged: list[tuple[int, int]] = []
            for start, size in self._free:
                if merged and merged[-1][0] + merged[-1][1] == start:
                    merged[-1] = (merged[-1][0], merged[-1][1] + size)
                else:
                    merged.append((start, size))
            self._free = merged

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(size for _, size in self._free)
