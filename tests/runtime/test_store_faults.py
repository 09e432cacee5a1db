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


def _metric(url: str, name: str) -> float:
    import httpx

    return sum(
        float(line.split()[-1])
        for line in httpx.get(f"{url}/metrics").text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


@pytest.mark.slow  # ~45 s: starts a cluster
def test_broken_blocks_are_recomputed_counted_and_written_again_on_the_same_server(tmp_path, reference):
    """Issue 20 row 6: blocks deleted or corrupted under a running server; the same prompt again gives the
    same tokens, the lost blocks are counted and their files come back, and the next replay hits them."""
    from runtime_helpers import complete, make_cluster

    store_dir = tmp_path / "store"
    prompt = [(5 * k) % 250 for k in range(16 * 8 + 5)]  # 8 whole blocks
    keys = block_keys(prompt, 16)
    with make_cluster(store_dir, extra=("--read-path", "de-read")) as server:
        first = complete(server.url, prompt, 4)
        assert complete(server.url, prompt, 4)["dualpath"]["effective_hit_tokens"] == 128  # indexed now
        store = FileStore(store_dir, 2**40)
        assert all(store.contains(k) for k in keys)
        for key in keys[1:8:2]:  # four gone, four damaged
            store.path_of(key).unlink()
        for key in keys[2:8:2]:
            data = bytearray(store.path_of(key).read_bytes())
            data[-1] ^= 0xFF
            store.path_of(key).write_bytes(bytes(data))
        again = complete(server.url, prompt, 4)
        assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
        assert again["dualpath"]["effective_hit_tokens"] == 16 < again["dualpath"]["hit_tokens"]
        assert _metric(server.url, "dualpath_lost_blocks_recomputed_total") == 7
        assert all(FileStore(store_dir, 2**40).contains(k) for k in keys)  # written again
        third = complete(server.url, prompt, 4)
        assert third["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
        assert third["dualpath"]["effective_hit_tokens"] == third["dualpath"]["hit_tokens"] == 128
