"""Emulated NICs (EMULATION: real rate limiters standing in for CNIC/SNIC hardware, paper §2.3, §5).

An `EmulatedNic` is full duplex: one `RateLimiter` per direction, each with the §5.1 class weights. The
node's storage NIC (`Snic`) also owns the FIFO **read queue** whose length the node reports to the
scheduler as `read_q` (paper §6.1, Algorithm 1).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from dualpath.transfer.ratelimit import DEFAULT_WEIGHTS, LimiterStats, RateLimiter
from dualpath.transfer.types import TrafficClass


@dataclass(frozen=True, kw_only=True)
class NicStats:
    name: str
    tx: LimiterStats
    rx: LimiterStats


class EmulatedNic:
    def __init__(
        self,
        name: str,
        rate_bytes_per_s: float,
        *,
        weights: Mapping[TrafficClass, float] = DEFAULT_WEIGHTS,
        chunk_bytes: int | None = None,
    ) -> None:
        self.name = name
        self.rate_bytes_per_s = rate_bytes_per_s
        self.tx = RateLimiter(rate_bytes_per_s, weights=weights, chunk_bytes=chunk_bytes, name=f"{name}.tx")
        self.rx = RateLimiter(rate_bytes_per_s, weights=weights, chunk_bytes=chunk_bytes, name=f"{name}.rx")

    def stats(self) -> NicStats:
        return NicStats(name=self.name, tx=self.tx.stats(), rx=self.rx.stats())


class ReadQueue:
    """Storage reads submitted and not yet finished, in bytes, requests and tokens (thread-safe).

    "Queued" includes reads in flight: `read_q` estimates the work still ahead of a new read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = {}
        self._tokens: dict[str, int] = {}

    def add(self, job_id: str, nbytes: int, tokens: int) -> None:
        with self._lock:
            if job_id in self._bytes:
                raise ValueError(f"read job {job_id!r} is already queued")
            self._bytes[job_id], self._tokens[job_id] = nbytes, tokens

    def progress(self, job_id: str, nbytes_done: int) -> None:
        with self._lock:
            self._bytes[job_id] = max(0, self._bytes[job_id] - nbytes_done)

    def finish(self, job_id: str) -> None:
        with self._lock:
            self._bytes.pop(job_id, None)
            self._tokens.pop(job_id, None)

    @property
    def queued_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    @property
    def queued_tokens(self) -> int:
        with self._lock:
            return sum(self._tokens.values())

    @property
    def queued_requests(self) -> int:
        with self._lock:
            return len(self._bytes)


class Snic(EmulatedNic):
    """The storage NIC of a node: an `EmulatedNic` plus its FIFO read queue."""

    def __init__(
        self,
        name: str,
        rate_bytes_per_s: float,
        *,
        weights: Mapping[TrafficClass, float] = DEFAULT_WEIGHTS,
        chunk_bytes: int | None = None,
    ) -> None:
        super().__init__(name, rate_bytes_per_s, weights=weights, chunk_bytes=chunk_bytes)
        self.read_queue = ReadQueue()
