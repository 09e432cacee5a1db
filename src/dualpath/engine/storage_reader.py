"""A node's storage reader: the FIFO read queue on its SNIC (paper §6.1 `read_q[n]`).

NOTE: reads start in FIFO order, at most `max_inflight_reads` at a time, and only when the node's
DRAM buffer can hold the part (admission when full). A few reads in flight keep the SNIC busy across
per-read start-up costs (an io_uring-like queue depth, §4); more would only share the SNIC among
more reads and delay every one of them. The head blocks the queue when the buffer is full (FIFO).

`read_q_tokens` = hit tokens queued or in flight: what the node still has to read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final, NamedTuple

DEFAULT_MAX_INFLIGHT_READS: Final = 2


class ReadPart(NamedTuple):
    request_id: int
    node_id: int
    tokens: int  # hit tokens this node reads for the request
    reserve_bytes: float  # DRAM buffer this part needs (its KV, plus landing space on a DE)


class StorageReader:
    def __init__(self, node_id: int, *, max_inflight_reads: int = DEFAULT_MAX_INFLIGHT_READS) -> None:
        self.node_id = node_id
        self.max_inflight_reads = max_inflight_reads
        self._queue: deque[ReadPart] = deque()
        self._inflight: dict[int, ReadPart] = {}
        self.read_q_tokens = 0

    def enqueue(self, part: ReadPart) -> None:
        self._queue.append(part)
        self.read_q_tokens += part.tokens

    def admit(self, can_reserve: Callable[[ReadPart], bool]) -> list[ReadPart]:
        """Parts to start now, FIFO; `can_reserve` reserves the buffer and says whether it could."""
        started: list[ReadPart] = []
        while self._queue and len(self._inflight) < self.max_inflight_reads:
            if not can_reserve(self._queue[0]):
                break
            part = self._queue.popleft()
            self._inflight[part.request_id] = part
            started.append(part)
        return started

    def finish(self, request_id: int) -> ReadPart:
        part = self._inflight.pop(request_id)
        self.read_q_tokens -= part.tokens
        return part

    def drop(self, request_id: int) -> bool:
        """Forget the request's part, queued or in flight (its request was re-planned or cancelled; a
        read in flight finishes on the node and is discarded there). True if there was one."""
        part = self._inflight.pop(request_id, None)
        if part is None:
            part = next((p for p in self._queue if p.request_id == request_id), None)
            if part is None:
                return False
            self._queue.remove(part)
        self.read_q_tokens -= part.tokens
        return True

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def check_invariants(self) -> None:
        total = sum(p.tokens for p in self._queue) + sum(p.tokens for p in self._inflight.values())
        assert total == self.read_q_tokens, (total, self.read_q_tokens)
        assert len(self._inflight) <= self.max_inflight_reads
