"""Storage reads and writes through the node's emulated SNIC (paper §4.1 steps 1–2, §3 "persist").

    submit(ReadJob) ─► SNIC read queue (FIFO, counted in bytes/requests/tokens = read_q, §6)
                         └─► one job at a time (max_in_flight = 1): per block, pace its bytes through
                             snic.rx, then one positional read from the KVStore into the caller's buffer slice

The queue is served in order, whole job after whole job, as the paper's FIFO read queue: with two jobs on the
link at once their blocks would interleave and the first would finish only when both nearly have. Each job's
blocks name the moment it was queued as their `ready_s`, so the link goes from one job's last block to the
next job's first without waiting for the reading thread to come back (`RateLimiter`).

A block that is missing or fails its checksum is reported in the result, never raised: the caller
recomputes it (DESIGN §4 "faults"). Writes (DE persistence of full blocks) go FIFO through snic.tx.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from dualpath.kvcache import BlockKey, BlockMissingError, CorruptBlockError, KVStore
from dualpath.transfer.backend import Buffer
from dualpath.transfer.nic import Snic
from dualpath.transfer.types import TrafficClass


@dataclass(frozen=True, kw_only=True)
class BlockRead:
    key: BlockKey
    out: memoryview  # where the bytes go: a slice of a registered buffer
    layer: int | None = None  # None: the Full Block; else one Layer Block
    nbytes_hint: int = 0  # bytes expected (for the read queue before the block's header is known)


@dataclass(frozen=True, kw_only=True)
class ReadJob:
    job_id: str
    blocks: tuple[BlockRead, ...]
    tokens: int = 0  # tokens this read brings in, for read_q in tokens (paper §6.1)
    traffic_class: TrafficClass = TrafficClass.LOW


@dataclass(frozen=True, kw_only=True)
class ReadResult:
    job_id: str
    ok_keys: tuple[BlockKey, ...]
    missing_keys: tuple[BlockKey, ...]
    corrupt_keys: tuple[BlockKey, ...]
    bytes_read: int


class StorageReader:
    def __init__(self, store: KVStore, snic: Snic, *, max_in_flight: int = 1) -> None:
        self.store = store
        self.snic = snic
        # max_in_flight workers take jobs in submission order (module doc: 1, the FIFO).
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix=f"{snic.name}-read")

    def submit(self, job: ReadJob) -> Future[ReadResult]:
        nbytes = sum(b.nbytes_hint or b.out.nbytes for b in job.blocks)
        self.snic.read_queue.add(job.job_id, nbytes, job.tokens)
        return self._pool.submit(self._run, job, time.monotonic())

    def _run(self, job: ReadJob, queued_s: float) -> ReadResult:
        ok: list[BlockKey] = []
        missing: list[BlockKey] = []
        corrupt: list[BlockKey] = []
        total = 0
        try:
            for block in job.blocks:
                try:
                    total += self._read_block(block, job.traffic_class, queued_s)
                    ok.append(block.key)
                except BlockMissingError:
                    missing.append(block.key)
                except CorruptBlockError:
                    corrupt.append(block.key)
                self.snic.read_queue.progress(job.job_id, block.nbytes_hint or block.out.nbytes)
        finally:
            self.snic.read_queue.finish(job.job_id)
        return ReadResult(
            job_id=job.job_id,
            ok_keys=tuple(ok),
            missing_keys=tuple(missing),
            corrupt_keys=tuple(corrupt),
            bytes_read=total,
        )

    def _read_block(self, block: BlockRead, traffic_class: TrafficClass, ready_s: float) -> int:
        meta = self.store.block_meta(block.key)
        nbytes = meta.full_block_bytes if block.layer is None else meta.layer_block_bytes
        self.snic.rx.transmit(nbytes, traffic_class, ready_s=ready_s)
        if block.layer is None:
            return self.store.read_full_block_into(block.key, block.out)
        return self.store.read_layer_block_into(block.key, block.layer, block.out)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass(frozen=True, kw_only=True)
class BlockWrite:
    key: BlockKey
    data: Buffer
    num_layers: int
    parent: BlockKey | None = None


@dataclass(frozen=True, kw_only=True)
class WriteJob:
    job_id: str
    blocks: tuple[BlockWrite, ...]
    traffic_class: TrafficClass = TrafficClass.LOW


class StorageWriter:
    def __init__(self, store: KVStore, snic: Snic) -> None:
        self.store = store
        self.snic = snic
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{snic.name}-write")

    def submit(self, job: WriteJob) -> Future[int]:
        """Persist the blocks in order; the future gives the bytes actually written (present blocks skip)."""
        return self._pool.submit(self._run, job)

    def _run(self, job: WriteJob) -> int:
        written = 0
        for block in job.blocks:
            if self.store.contains(block.key):
                continue
            nbytes = memoryview(block.data).nbytes
            self.snic.tx.transmit(nbytes, job.traffic_class)
            if self.store.put_full_block(
                block.key, block.data, num_layers=block.num_layers, parent=block.parent
            ):
                written += nbytes
        return written

    def close(self) -> None:
        self._pool.shutdown(wait=True)
