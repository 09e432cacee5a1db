"""SchedulerBackend, the API's backend in the scheduler process, over a fake ClusterScheduler."""

from __future__ import annotations

import asyncio

import pytest

from dualpath.runtime.api import CompletionRequest, TokenChunk
from dualpath.runtime.limits import ServeLimits
from dualpath.runtime.model.tokenizer import ByteTokenizer
from dualpath.runtime.scheduler import LiveRequest, SchedulerBackend


class FakeScheduler:
    """submit() hands out rids and queues; cancel() records and ends the stream with "abort"."""

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer()
        self.limits = ServeLimits()
        self.live: dict[int, LiveRequest] = {}
        self.cancelled: list[int] = []

    def submit(self, api: CompletionRequest):
        live = LiveRequest(rid=len(self.live), api=api, chunks=asyncio.Queue(), hit_tokens=32)
        self.live[live.rid] = live
        return live, []

    def cancel(self, rid: int):
        self.cancelled.append(rid)
        self.live[rid].chunks.put_nowait(
            TokenChunk(token_ids=(), finish_reason="abort", info={"cancelled": True})
        )
        return []

    def admission_error(self, prompt_tokens: int, max_tokens: int) -> str | None:
        return "too big" if prompt_tokens > 100 else None


def _request(request_id: str) -> CompletionRequest:
    return CompletionRequest(
        request_id=request_id, prompt_token_ids=(1, 2), max_tokens=4, ignore_eos=False, arrival_s=0.0
    )


def test_closing_the_stream_early_cancels_in_the_cluster_and_finishing_does_not():
    async def run() -> FakeScheduler:
        scheduler = FakeScheduler()
        backend = SchedulerBackend(scheduler)  # type: ignore[arg-type]
        left = backend.generate(_request("a"))
        scheduler_live = None
        first = asyncio.ensure_future(left.__anext__())
        await asyncio.sleep(0)
        scheduler_live = scheduler.live[0]
        scheduler_live.chunks.put_nowait(TokenChunk(token_ids=(5,)))
        assert (await first).token_ids == (5,)
        await left.aclose()  # the client left

        done = backend.generate(_request("b"))
        second = asyncio.ensure_future(done.__anext__())
        await asyncio.sleep(0)
        scheduler.live[1].chunks.put_nowait(TokenChunk(token_ids=(), finish_reason="length"))
        assert (await second).finish_reason == "length"
        await done.aclose()
        return scheduler

    assert asyncio.run(run()).cancelled == [0]


def test_cancel_by_request_id_ends_the_stream_with_the_planned_cached_tokens():
    async def run() -> list[TokenChunk]:
        scheduler = FakeScheduler()
        backend = SchedulerBackend(scheduler)  # type: ignore[arg-type]
        chunks = backend.generate(_request("a"))
        first = asyncio.ensure_future(chunks.__anext__())
        await asyncio.sleep(0)
        backend.cancel("a")  # a stop string matched
        backend.cancel("a")  # twice is harmless
        out = [await first]
        out += [chunk async for chunk in chunks]
        assert scheduler.cancelled == [0]
        return out

    (last,) = asyncio.run(run())
    assert last.finish_reason == "abort" and last.info["cached_tokens"] == 32


def test_chat_tokens_admission_and_template_refusals():
    backend = SchedulerBackend(FakeScheduler())  # type: ignore[arg-type]
    ids = backend.chat_token_ids([{"role": "user", "content": "hi"}])
    assert ids[0] == ByteTokenizer().bos_id and ids.count(ByteTokenizer().bos_id) == 1
    assert bytes(ids[1:]).decode().endswith("hi\n<|assistant|>\n")
    assert backend.tokenize("a", add_special_tokens=False) == [97]
    assert backend.admission_error(101, 1) == "too big" and backend.admission_error(5, 1) is None

    class Refusing(ByteTokenizer):
        def encode_chat(self, messages, *, add_generation_prompt=True):
            raise RuntimeError("roles must alternate")

    refusing = FakeScheduler()
    refusing.tokenizer = Refusing()
    with pytest.raises(ValueError, match="roles must alternate"):
        SchedulerBackend(refusing).chat_token_ids([{"role": "user", "content": "hi"}])  # type: ignore[arg-type]
