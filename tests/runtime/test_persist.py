"""`PipelinedWriter`: the SNIC paces the next blocks while earlier commits are still running; a job's
future resolves only once every block of it is committed (durable)."""

from __future__ import annotations

import threading
import time

import pytest

from dualpath.runtime.persist import COMMITS_IN_FLIGHT, PipelinedWriter
from dualpath.transfer import BlockWrite, Snic, WriteJob

BLOCK_BYTES = 4096


class GatedStore:
    """Commits wait for `gate`; records what was committed."""

    def __init__(self, present: set[bytes] = frozenset()) -> None:  # type: ignore[assignment]
        self.gate = threading.Event()
        self.present = set(present)
        self.started: list[bytes] = []
        self.committed: list[bytes] = []
        self._lock = threading.Lock()

    def contains(self, key: bytes) -> bool:
        return key in self.present

    def put_full_block(self, key: bytes, data: object, *, num_layers: int, parent: object = None) -> bool:
        with self._lock:
            self.started.append(key)
        self.gate.wait(10)
        with self._lock:
            self.committed.append(key)
            self.present.add(key)
        return True


def _job(keys: list[bytes]) -> WriteJob:
    return WriteJob(
        job_id="j", blocks=tuple(BlockWrite(key=k, data=b"x" * BLOCK_BYTES, num_layers=1) for k in keys)
    )


def _wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_link_time_overlaps_commits_and_the_future_waits_for_durability() -> None:
    store = GatedStore()
    snic = Snic("d0.snic", 1e9)
    writer = PipelinedWriter(store, snic)  # type: ignore[arg-type]
    keys = [bytes([65 + i]) for i in range(COMMITS_IN_FLIGHT + 2)]
    try:
        future = writer.submit(_job(keys))
        # Every block crossed the link while the first commits are still blocked: pacing did not wait.
        _wait_for(lambda: snic.stats().tx.total_bytes == len(keys) * BLOCK_BYTES)
        assert store.committed == []
        _wait_for(lambda: len(store.started) == COMMITS_IN_FLIGHT)
        time.sleep(0.05)
        assert len(store.started) == COMMITS_IN_FLIGHT  # that many commits in flight, two queued behind
        assert not future.done()  # not durable yet: a next round must not count these as hits
        store.gate.set()
        assert future.result(5) == len(keys) * BLOCK_BYTES
        assert sorted(store.committed) == keys
    finally:
        store.gate.set()
        writer.close()


def test_present_blocks_are_skipped_and_errors_reach_the_future() -> None:
    store = GatedStore(present={b"a", b"b"})
    store.gate.set()
    snic = Snic("d0.snic", 1e9)
    writer = PipelinedWriter(store, snic)  # type: ignore[arg-type]
    try:
        assert writer.submit(_job([b"a", b"b"])).result(5) == 0
        assert snic.stats().tx.total_bytes == 0
        assert writer.submit(_job([b"a", b"c"])).result(5) == BLOCK_BYTES

        def broken(*args: object, **kwargs: object) -> bool:
            raise OSError("disk full")

        store.put_full_block = broken  # type: ignore[method-assign]
        with pytest.raises(OSError, match="disk full"):
            writer.submit(_job([b"d", b"e"])).result(5)
    finally:
        writer.close()
