"""Requests that can never be served, bounded bodies and queue, deadlines, and lost blocks written again
(issue 20, rows 6 and 14)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fake_cluster import FakeCluster, small_config

from dualpath.protocol.errors import ProtocolError
from dualpath.runtime.api import CompletionRequest
from dualpath.runtime.cluster import ClusterConfigError, apply_settings, load_cluster
from dualpath.runtime.driver import RuntimeDriver
from dualpath.runtime.limits import RequestLimits, ServeLimits
from dualpath.runtime.scheduler import ClusterScheduler, LiveRequest, SchedulerBackend
from dualpath.runtime.serve import preflight


def _scheduler(tmp_path, *settings: str) -> ClusterScheduler:
    spec = apply_settings(load_cluster("local-1p2d"), list(settings))
    return ClusterScheduler(spec, tmp_path / "store", limits=ServeLimits(request_timeout_s=0.2))


def _hello(role: str, name: str) -> dict:
    return {"type": "hello", "name": name, "role": role, "model": "tiny-llama", "vocab_size": 260,
            "max_context_tokens": 8192, "kv_bytes_per_token": 4096, "prefill_tokens_per_s": 1e4}  # fmt: skip


def test_admission_refuses_what_no_engine_or_buffer_can_hold(tmp_path):
    scheduler = _scheduler(tmp_path, "hbm_tokens=512", "dram_buffer_bytes=1MiB")
    scheduler.model_info = {"kv_bytes_per_token": 4096}  # tiny-llama: 4 layers x 1 KiB
    assert scheduler.admission_error(100, 16) is None
    assert "hbm_tokens" in (scheduler.admission_error(500, 16) or "")
    assert "dram_buffer_bytes" in (scheduler.admission_error(200, 16) or "")


def test_a_cluster_that_cannot_serve_a_default_request_is_refused_at_start(tmp_path):
    with pytest.raises(ClusterConfigError, match="hbm_tokens = 64"):
        preflight(apply_settings(load_cluster("local-1p2d"), ["hbm_tokens=64"]))
    scheduler = _scheduler(tmp_path, "dram_buffer_bytes=1MiB")  # the KV size is known at the hellos
    scheduler.handle("p0", _hello("prefill", "p0"))
    scheduler.handle("d0", _hello("decode", "d0"))
    with pytest.raises(ClusterConfigError, match="dram_buffer_bytes"):
        scheduler.handle("d1", _hello("decode", "d1"))


def test_a_lost_block_is_recomputed_and_its_request_persists_it_again():
    """Request 1 planned a 32-token hit; its read found the second block bad (16 usable tokens). The
    prompt's persist starts at 16, not at the planned hit's end, so the bad block is written again."""
    driver = RuntimeDriver(small_config("dualpath", read_path="pe-read"))
    cluster = FakeCluster(driver, corrupt_reads={1: 16})
    for i in range(3):
        cluster.submit_at(0.0, [(7 * i + k) % 250 for k in range(64 + 48 * i)], 32 * (i % 3), 4)
    cluster.run()
    persists = {m["rid"]: m for _, _, m in cluster.sent if m["type"] == "persist" and not m["from_hbm"]}
    assert persists[1]["start_tokens"] == 16 and persists[1]["end_tokens"] == 112
    assert persists[2]["start_tokens"] == 64  # an intact hit is not written again


def _app(queue_full: bool, limits: ServeLimits):
    async def echo(scope, receive, send):
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return RequestLimits(echo, limits, lambda: queue_full)


def test_bodies_over_the_limit_get_413_and_a_full_queue_429_with_retry_after():
    async def run():
        limits = ServeLimits(max_body_bytes=100, max_waiting=3)
        for full, body, status in [(False, b"x" * 50, 200), (False, b"x" * 101, 413), (True, b"{}", 429)]:
            transport = httpx.ASGITransport(app=_app(full, limits))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                response = await client.post("/v1/completions", content=body)
                assert response.status_code == status, response.text
                if status == 200:
                    assert response.content == body
                elif status == 429:
                    assert response.headers["retry-after"] == "1" and "3 requests" in response.text
                else:
                    assert response.json()["error"]["code"] == 413

                async def chunks():
                    for _ in range(3):
                        yield b"y" * 40

                if status == 200:  # no content-length: counted as it arrives
                    response = await client.post("/v1/completions", content=chunks())
                    assert response.status_code == 413

    asyncio.run(run())


def test_a_request_past_its_deadline_ends_with_504_and_is_cancelled(tmp_path):
    scheduler = _scheduler(tmp_path)
    cancelled = []

    async def run():
        request = CompletionRequest(request_id="r", prompt_token_ids=(1, 2), max_tokens=4, ignore_eos=True,
                                    arrival_s=time.time())  # fmt: skip
        live = LiveRequest(rid=7, api=request, chunks=asyncio.Queue(), hit_tokens=0)
        scheduler.submit = lambda api: (live, [])  # nothing ever answers: a stuck request
        scheduler.cancel = lambda rid: cancelled.append(rid) or []
        begin = time.monotonic()
        with pytest.raises(ProtocolError) as error:
            async for _ in SchedulerBackend(scheduler).generate(request):
                pass
        return error.value, time.monotonic() - begin

    error, elapsed_s = asyncio.run(run())
    assert error.status == 504 and "request-timeout" in error.message
    assert 0.15 < elapsed_s < 2.0 and cancelled == [7]


def test_the_queue_is_full_at_max_waiting_requests(tmp_path):
    spec = load_cluster("local-1p2d")
    scheduler = ClusterScheduler(spec, tmp_path / "store", limits=ServeLimits(max_waiting=2))
    for role, name in (("prefill", "p0"), ("decode", "d0"), ("decode", "d1")):
        scheduler.handle(name, _hello(role, name))
    assert not scheduler.queue_full()
    for i in range(2):
        request = CompletionRequest(request_id=f"r{i}", prompt_token_ids=tuple(range(1, 40)), max_tokens=4,
                                    ignore_eos=True, arrival_s=time.time())  # fmt: skip
        scheduler.submit(request)  # the nodes are not ready: nothing is placed, both wait
    assert scheduler.queue_full()
