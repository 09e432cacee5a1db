"""`PipelinedWriter`: the DE's block persistence through its SNIC, link time overlapped with commits.

NOTE: a block write has two parts: its bytes cross the SNIC (tx, paced at the emulated rate), then the
store commits it (here `FileStore`: write, fsync, rename, fsync of the folder — 6.5-8 ms per 64 KiB block
measured on the 2-core dev VM, against ≈11 ms of link time at 6 MB/s). Done one after the other, as
`transfer.StorageWriter` does, the link idles during every commit and a DE persists at barely half its
SNIC rate. A NIC streams the next block while the storage side commits the last (3FS acknowledges each
write once it is durable), so here one thread paces the blocks FIFO and a small pool commits them:

    pacing thread  ─[block 1 on tx]─[block 2 on tx]─[block 3 on tx]─ ...   (the SNIC stays busy)
    commit pool                     └[commit 1]────┘└[commit 2]────┘ ...   (write + fsync, off the link)

A job's future completes once every block of it is committed (durable), so "persisted" still means a
next round's hit can read it. Blocks already present are skipped, as `StorageWriter` does.

A commit that fails with an OSError (ENOSPC, EIO, ...) fails its job's future, as any error does: the
block is simply not stored, a later round misses it and recomputes (DESIGN §4 "faults"), and serving
goes on. `WriteFailures` counts them for /metrics and logs once per burst: the first failure, then one
line when a write succeeds again (space came back), so a full disk does not flood the log.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from dualpath.kvcache import KVStore
from dualpath.transfer import BlockWrite, WriteJob
from dualpath.transfer.nic import Snic

# Commits in flight per DE: fsync waits on the disk with the GIL released, and the disk takes concurrent
# commits. Measured on the 2-core dev VM (2026-12-03, 160 blocks of 64 KiB into a `FileStore`): 6.5 ms per
# block one at a time, 2.5 ms with 2 in flight, 1.2 with 4, 0.72 with 8, 0.61 with 16. Chosen: 8. With 2,
# an unpaced DE (Oracle) took ≈ 1.3 s to commit a round 0's prompts (≈ 530 blocks) and each request
# waits for its own blocks before it is done; a paced DE at ≥ 14 MB/s (4.7 ms of link per block) was
# bound by its commits too.
COMMITS_IN_FLIGHT = 8
_log = logging.getLogger(__name__)


class WriteFailures:
    """Failed block writes: a count, and a log line at the start and at the end of each burst."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.total = 0
        self._in_burst = 0  # failures since the last success
        self._lock = threading.Lock()

    def failed(self, error: OSError) -> None:
        with self._lock:
            self.total += 1
            self._in_burst += 1
            first = self._in_burst == 1
        if first:
            _log.warning("%s: KV block writes failing (%s); serving goes on without persisting them",
                         self.name, error)  # fmt: skip

    def succeeded(self) -> None:
        with self._lock:
            burst, self._in_burst = self._in_burst, 0
        if burst:
            _log.warning("%s: KV block writes resumed after %d failed", self.name, burst)


class _Job:
    """Counts a job's outstanding commits; resolves its future after the last one."""

    def __init__(self, future: Future[int], blocks: int) -> None:
        self.future = future
        self._left = blocks
        self._written = 0
        self._lock = threading.Lock()

    def committed(self, nbytes: int) -> None:
        with self._lock:
            self._written += nbytes
            self._left -= 1
            last = self._left == 0
        if last and not self.future.done():
            self.future.set_result(self._written)


class PipelinedWriter:
    def __init__(
        self,
        store: KVStore,
        snic: Snic,
        *,
        commits_in_flight: int = COMMITS_IN_FLIGHT,
        full_switch: Path | None = None,
    ) -> None:
        self.store = store
        # Fault injection (benchmarks/chaos.py): while this file exists every block write fails with
        # ENOSPC, as on a full disk, without filling one.
        self.full_switch = full_switch
        self.snic = snic
        self._pace = ThreadPoolExecutor(1, thread_name_prefix=f"{snic.name}-write")  # FIFO on the link
        self._commit = ThreadPoolExecutor(commits_in_flight, thread_name_prefix=f"{snic.name}-commit")
        self.failures = WriteFailures(snic.name)

    def submit(self, job: WriteJob) -> Future[int]:
        """Persist the blocks (paced in order); the future gives the bytes written once all are durable."""
        future: Future[int] = Future()
        self._pace.submit(self._run, job, future, time.monotonic())
        return future

    def _run(self, job: WriteJob, future: Future[int], ready_s: float) -> None:
        """`ready_s`: when the job's bytes were in host memory; the link may start them from then on, so
        this thread's late wake-ups between blocks do not leave the emulated SNIC idle (`RateLimiter`)."""
        try:
            todo = [b for b in job.blocks if not self.store.contains(b.key)]
            if not todo:
                future.set_result(0)
                return
            state = _Job(future, len(todo))
            for block in todo:
                self.snic.tx.transmit(memoryview(block.data).nbytes, job.traffic_class, ready_s=ready_s)
                self._commit.submit(self._put, block, state)
        except BaseException as error:  # noqa: BLE001 - the caller waits on the future: hand it over
            if not future.done():
                future.set_exception(error)

    def _put(self, block: BlockWrite, state: _Job) -> None:
        try:
            if self.full_switch is not None and self.full_switch.exists():
                raise OSError(errno.ENOSPC, f"No space left on device (switch {self.full_switch} is on)")
            put = self.store.put_full_block(
                block.key, block.data, num_layers=block.num_layers, parent=block.parent
            )
            if put:
                self.failures.succeeded()
            state.committed(memoryview(block.data).nbytes if put else 0)
        except OSError as error:
            self.failures.failed(error)
            if not state.future.done():
                state.future.set_exception(error)
        except BaseException as error:  # noqa: BLE001
            if not state.future.done():
                state.future.set_exception(error)

    def close(self) -> None:
        self._pace.shutdown(wait=True, cancel_futures=True)
        self._commit.shutdown(wait=True)
