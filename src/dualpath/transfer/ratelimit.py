"""`RateLimiter`: an emulated link with traffic classes and weighted arbitration (EMULATION, not hardware).

NOTE: the link is a virtual timeline of back-to-back chunks. Each chunk of c bytes holds the link for c/rate
seconds and starts no earlier than the previous chunk ended, so the bytes that pass in any window of T seconds
never exceed rate·T + one chunk. The caller sleeps until its chunk's finish time (threading; no busy wait).

    link   |HIGH c|HIGH c|HIGH c| LOW c |HIGH c|HIGH c| ...   (both classes waiting)
    link   | LOW c | LOW c | LOW c | LOW c | ...               (HIGH idle: LOW gets the full rate)

Between chunks the next class is chosen by weighted fair queueing: each class has a virtual time that grows
by c/weight per chunk served, and the waiting class with the smallest virtual time goes next. With weights
HIGH 99 / LOW 1 this is the paper's WRR on InfiniBand VLs (§5.1, Appendix A.1: ≈99 % to model traffic, the
rest to KV). It is work-conserving: an idle class leaves the whole link to the other. Chunking bounds how long a
LOW bulk transfer can hold the link in front of a HIGH one to one chunk time. Within a class, transfers are
served FIFO (the SNIC read queue of §6 is FIFO).

A transfer may name `ready_s`, the moment its bytes were ready (time.monotonic()). An idle link starts it then,
not when the calling thread got to run: a thread that queues blocks one after another wakes late after each
(the GIL, with a busy decode or prefill loop in the same process, adds up to a switch interval of 5 ms per
wake-up), and a NIC with the next block already in its queue would not idle in those gaps. The start is never
before the previous chunk ended, so the rate bound above still holds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from dualpath.transfer.types import TrafficClass

# Paper §5.1 / A.1: WRR gives ≈99 % of a link to the high-priority VL while both are backlogged.
DEFAULT_WEIGHTS: Mapping[TrafficClass, float] = {TrafficClass.HIGH: 99.0, TrafficClass.LOW: 1.0}
# Chunks of ≈1 ms of link time, kept within 64 KiB–1 MiB: small enough that a HIGH transfer waits at most
# about a millisecond behind a LOW one, large enough that thread wake-ups (≈50–100 µs on Linux) stay a small
# share of each chunk.
CHUNK_TIME_S = 1e-3
MIN_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 1024 * 1024


def default_chunk_bytes(rate_bytes_per_s: float) -> int:
    return int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, rate_bytes_per_s * CHUNK_TIME_S)))


@dataclass(frozen=True, kw_only=True)
class LimiterStats:
    rate_bytes_per_s: float
    bytes_by_class: Mapping[str, int] = field(default_factory=dict)
    busy_s: float = 0.0  # time with at least one transfer in flight (queued or moving)
    wall_s: float = 0.0  # time since the limiter was made

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_class.values())

    @property
    def utilisation(self) -> float:
        """bytes / (rate × wall time)."""
        return self.total_bytes / (self.rate_bytes_per_s * self.wall_s) if self.wall_s > 0 else 0.0


@dataclass
class _Ticket:
    traffic_class: TrafficClass
    remaining_bytes: int
    grant_bytes: int = 0
    finish_s: float | None = None  # set when the ticket holds the link


class RateLimiter:
    def __init__(
        self,
        rate_bytes_per_s: float,
        *,
        weights: Mapping[TrafficClass, float] = DEFAULT_WEIGHTS,
        chunk_bytes: int | None = None,
        name: str = "",
    ) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError(f"rate_bytes_per_s must be positive, got {rate_bytes_per_s}")
        if set(weights) != set(TrafficClass) or min(weights.values()) <= 0:
            raise ValueError(f"weights need a positive value for each of {[c.name for c in TrafficClass]}")
        self.name = name
        self.rate_bytes_per_s = float(rate_bytes_per_s)
        self.chunk_bytes = chunk_bytes or default_chunk_bytes(rate_bytes_per_s)
        self._weights = dict(weights)
        self._cond = threading.Condition()
        self._queues: dict[TrafficClass, deque[_Ticket]] = {c: deque() for c in TrafficClass}
        self._vtime = {c: 0.0 for c in TrafficClass}
        self._vclock = 0.0
        self._holder: _Ticket | None = None
        self._free_at_s = 0.0
        self._bytes = {c: 0 for c in TrafficClass}
        self._in_flight = 0
        self._busy_since_s = 0.0
        self._busy_s = 0.0
        self._created_s = time.monotonic()

    # ---- public API -------------------------------------------------------------------------
    def transmit(
        self, nbytes: int, traffic_class: TrafficClass = TrafficClass.LOW, *, ready_s: float | None = None
    ) -> None:
        """Block until `nbytes` may have crossed the link; `ready_s`: when they were ready (module doc)."""
        for _ in self.chunks(nbytes, traffic_class, ready_s=ready_s):
            pass

    def chunks(
        self, nbytes: int, traffic_class: TrafficClass = TrafficClass.LOW, *, ready_s: float | None = None
    ) -> Iterator[tuple[int, int]]:
        """Yield (offset, length) of each chunk once its link time has passed, so the caller can move that
        chunk's bytes (PacedBackend copies chunk by chunk)."""
        if nbytes <= 0:
            return
        ticket = _Ticket(traffic_class, nbytes)
        self._enqueue(ticket, ready_s)
        offset = 0
        try:
            while ticket.remaining_bytes:
                length = self._wait_chunk(ticket)
                yield offset, length
                offset += length
        finally:
            self._leave(ticket)

    @property
    def queued_bytes(self) -> int:
        with self._cond:
            return sum(t.remaining_bytes for q in self._queues.values() for t in q)

    def stats(self) -> LimiterStats:
        with self._cond:
            now = time.monotonic()
            busy = self._busy_s + (now - self._busy_since_s if self._in_flight else 0.0)
            return LimiterStats(
                rate_bytes_per_s=self.rate_bytes_per_s,
                bytes_by_class={c.name: n for c, n in self._bytes.items()},
                busy_s=busy,
                wall_s=now - self._created_s,
            )

    # ---- the link ---------------------------------------------------------------------------
    def _enqueue(self, ticket: _Ticket, ready_s: float | None) -> None:
        with self._cond:
            now = time.monotonic()
            start_s = now if ready_s is None else min(ready_s, now)
            queue = self._queues[ticket.traffic_class]
            if not queue:  # (re)activating class: no credit banked while idle (WFQ)
                self._vtime[ticket.traffic_class] = max(self._vtime[ticket.traffic_class], self._vclock)
            queue.append(ticket)
            if self._in_flight == 0:
                self._busy_since_s = max(start_s, self._free_at_s)
            self._in_flight += 1
            self._dispatch(start_s)  # an idle link: from when the bytes were ready, not before it was free

    def _wait_chunk(self, ticket: _Ticket) -> int:
        with self._cond:
            while ticket.finish_s is None:
                self._cond.wait()
            finish_s, length = ticket.finish_s, ticket.grant_bytes
        delay_s = finish_s - time.monotonic()
        if delay_s > 0:
            time.sleep(delay_s)
        with self._cond:
            self._bytes[ticket.traffic_class] += length
            ticket.remaining_bytes -= length
            ticket.finish_s = None
            self._holder = None
            if not ticket.remaining_bytes:
                self._queues[ticket.traffic_class].remove(ticket)
            self._dispatch(finish_s)  # the link continues where this chunk ended: no gap, no overlap
            self._cond.notify_all()
        return length

    def _leave(self, ticket: _Ticket) -> None:
        """Always runs when a transfer ends, also when its caller abandons it halfway."""
        with self._cond:
            if ticket in self._queues[ticket.traffic_class]:
                self._queues[ticket.traffic_class].remove(ticket)
                if self._holder is ticket:
                    self._holder = None
                    self._dispatch(time.monotonic())
                    self._cond.notify_all()
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_s += time.monotonic() - self._busy_since_s

    def _dispatch(self, start_s: float) -> None:
        """Give the free link to the head transfer of the waiting class with the least virtual time."""
        if self._holder is not None:
            return
        waiting = [c for c in TrafficClass if self._queues[c]]
        if not waiting:
            return
        cls = min(waiting, key=lambda c: (self._vtime[c], c))
        ticket = self._queues[cls][0]
        length = min(self.chunk_bytes, ticket.remaining_bytes)
        self._vclock = self._vtime[cls]
        self._vtime[cls] += length / self._weights[cls]
        start_s = max(start_s, self._free_at_s)
        self._free_at_s = start_s + length / self.rate_bytes_per_s
        ticket.grant_bytes, ticket.finish_s = length, self._free_at_s
        self._holder = ticket
        self._cond.notify_all()
