"""Store faults seen from a node: a full disk (ENOSPC) is counted and logged once per burst, serving goes
on, and writes resume when space returns (issue 20, row 8)."""

from __future__ import annotations

import errno
import logging

import numpy as np
import pytest

from dualpath.kvcache import FileStore, block_keys
from dualpath.runtime.persist import PipelinedWriter
from dualpath.runtime.prom import ServeMetrics
from dualpath.transfer import BlockWrite, Snic, WriteJob


def _jobs(n: int) -> list[WriteJob]:
    keys = block_keys(list(range(16 * n)), 16)
    data = np.arange(4 * 16 * 8, dtype=np.uint8)
    return [
        WriteJob(job_id=f"j{i}", blocks=(BlockWrite(key=k, data=data, num_layers=4),))
        for i, k in enumerate(keys)
    ]


def test_a_full_disk_fails_writes_once_logged_counted_and_writes_resume(tmp_path, monkeypatch, caplog):
    store = FileStore(tmp_path, 2**30)
    writer = PipelinedWriter(store, Snic("d0.snic", 1e9))
    real_write = FileStore._write
    full = {"on": True}

    def write(self, *args, **kwargs):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(FileStore, "_write", write)
    jobs = _jobs(6)
    try:
        with caplog.at_level(logging.WARNING, logger="dualpath.runtime.persist"):
            for job in jobs[:4]:
                with pytest.raises(OSError, match="No space"):
                    writer.submit(job).result(5)
            full["on"] = False
            assert [writer.submit(job).result(5) for job in jobs[4:]] == [4 * 16 * 8] * 2
    finally:
        writer.close()
    assert writer.failures.total == 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "failing" in lines[0] and "resumed after 4" in lines[1], lines
    assert store.stats().num_blocks == 2 and not list(tmp_path.rglob("*.tmp"))

    metrics = ServeMetrics()
    metrics.observe_node("d0", {"store_write_errors": float(writer.failures.total)})
    assert 'dualpath_store_write_errors_total{node="d0"} 4.0' in metrics.text().decode()
