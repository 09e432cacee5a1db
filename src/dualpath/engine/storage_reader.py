"""A node's storage reader: the FIFO read queue on its SNIC (paper §6.1 `read_q[n]`).

NOTE: reads start in FIFO order, at most `max_inflight_reads` at a time, and only when the node's
DRAM buffer can hold the part (admission when full). A few reads in flight keep the SNIC busy across
per-read start-up costs (an io_uring-like queue depth, §4); more would only share the SNIC among
more reads and delay every one of them. The head blocks the queue when the buffer is full (FIFO).

`read_q_tokens` = hit tokens queued or in flight: what the node still has to read.
"""

from __future__ import annotations

from typing import Final

from dualpath.engine.buffers import CapacityPool
from dualpath.policy.fifo import Fifo
from dualpath.records import fields_repr

DEFAULT_MAX_INFLIGHT_READS: Final = 2


_READ_PART_FIELDS = ("request_id", "node_id", "tokens", "reserve_bytes")  # repr (and slots, with `owner`)


class ReadPart:
    """One node's share of a request's hit read (a plain slotted record: see `EngineLoad`)."""

    __slots__ = (*_READ_PART_FIELDS, "owner")

    def __init__(
        self, *, request_id: int, node_id: int, tokens: int, reserve_bytes: float, owner: object = None
    ) -> None:
        self.request_id = request_id
        self.node_id = node_id
        self.tokens = tokens  # hit tokens this node reads for the request
        self.reserve_bytes = reserve_bytes  # DRAM buffer this part needs (its KV, plus landing space on a DE)
        # Who holds that buffer (`CapacityPool`, compared by identity): the request; its id if none given.
        self.owner = owner if owner is not None else request_id

    def __repr__(self) -> str:
        return fields_repr(self, _READ_PART_FIELDS)


class StorageReader:
    def __init__(self, node_id: int, *, max_inflight_reads: int = DEFAULT_MAX_INFLIGHT_READS) -> None:
        self.node_id = node_id
        self.max_inflight_reads = max_inflight_reads
        self._queue: Fifo[ReadPart] = Fifo()
        # The parts in flight, in start order: a list, as there are `max_inflight_reads` (2) at most, so a
        # scan by request id costs less than a dict's hash and lookup of the id as an int object.
        self._inflight: list[ReadPart] = []
        self.read_q_tokens = 0

    def enqueue(self, part: ReadPart) -> None:
        self._queue.append(part)
        self.read_q_tokens += part.tokens

    def admit(self, buffer: CapacityPool) -> list[ReadPart]:
        """Parts to start now, FIFO, each with its `reserve_bytes` reserved in the node's DRAM `buffer`
        (owned by its request); the head waits while the buffer cannot hold it."""
        started: list[ReadPart] = []
        part = self.admit_next(buffer)
        while part is not None:
            started.append(part)
            part = self.admit_next(buffer)
        return started

    def admit_next(self, buffer: CapacityPool) -> ReadPart | None:
        """The next part `admit` would start, started (None: none can start now). The core's loop, which
        makes no list for the common call that starts nothing."""
        if not self._queue or len(self._inflight) >= self.max_inflight_reads:
            return None
        head = self._queue.peek()
        if not buffer.can_reserve(head.reserve_bytes):
            return None
        buffer.reserve(head.owner, head.reserve_bytes)
        part = self._queue.popleft()
        self._inflight.append(part)
        return part

    def finish(self, request_id: int) -> ReadPart:
        part = self._pop_inflight(request_id)
        if part is None:
            raise KeyError(f"node {self.node_id}: no read of request {request_id} in flight")
        self.read_q_tokens -= part.tokens
        return part

    def in_flight(self, request_id: int) -> ReadPart | None:
        """The request's part being read now (None if it is not in flight)."""
        for part in self._inflight:
            if part.request_id == request_id:
                return part
        return None

    def _pop_inflight(self, request_id: int) -> ReadPart | None:
        inflight = self._inflight
        for i in range(len(inflight)):
            part = inflight[i]
            if part.request_id == request_id:
                del inflight[i]
                return part
        return None

    def drop(self, request_id: int) -> bool:
        """Forget the request's part, queued or in flight (its request was re-planned or cancelled; a
        read in flight finishes on the node and is discarded there). True if there was one."""
        part = self._pop_inflight(request_id)
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
        total = sum(p.tokens for p in self._queue) + sum(p.tokens for p in self._inflight)
        assert total == self.read_q_tokens, (total, self.read_q_tokens)
        assert len(self._inflight) <= self.max_inflight_reads
