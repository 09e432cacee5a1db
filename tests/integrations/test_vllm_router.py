"""`dualpath route` without vLLM: the book's decisions (our policy code) and the proxy in front of fake vLLM
instances (the same HTTP surface: /tokenize, /v1/completions, /v1/chat/completions, /v1/models)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from dualpath.integrations.vllm.router import Router, RouterConfig, make_app
from dualpath.integrations.vllm.router_book import RouterBook
from dualpath.kvcache import FileStore, block_keys


def test_basic_is_round_robin_on_the_pe_read_path() -> None:
    book = RouterBook(2, ["d0"], mode="basic", block_tokens=32)
    placed = [book.place(100, 64) for _ in range(3)]
    assert [p.prefill for p in placed] == [0, 1, 0]
    assert {p.read_path for p in placed} == {"pe"}


def test_dualpath_reads_from_the_node_with_the_shorter_queue_and_balances_tokens() -> None:
    book = RouterBook(2, ["d0", "d1"], mode="dualpath", block_tokens=32)
    first = book.place(1000, 960)  # everything empty: prefill 0, read on its own node (a tie goes to the PE)
    assert (first.prefill, first.read_path) == (0, "pe")
    second = book.place(1000, 960)  # prefill 1 has the fewer tokens; its node's queue is empty: PE again
    assert (second.prefill, second.read_path) == (1, "pe")
    third = book.place(1000, 960)  # both PE nodes have 960 queued: the decode node d0 reads
    assert (third.read_path, third.de_endpoint) == ("de", "d0")
    assert third.kv_transfer_params == {"dualpath": {"read_path": "de", "de_endpoint": "d0"}}
    fourth = book.place(1000, 960)
    assert (fourth.read_path, fourth.de_endpoint) == ("de", "d1")
    for p in (first, second, third, fourth):
        book.loaded(p)
        book.finished(p, loaded=True)
    assert book.tok == [0, 0] and book.compute_tok == [0, 0] and book.pe_read_q == [0, 0]
    assert set(book.de_read_q.values()) == {0}


def test_algorithm_1_skips_an_instance_over_beta() -> None:
    book = RouterBook(2, [], mode="dualpath", block_tokens=32, beta_tokens=500)
    busy = book.place(900, 0)  # 900 miss tokens on prefill 0: over β
    assert busy.prefill == 0
    assert book.place(10, 0).prefill == 1
    assert book.place(10, 0).prefill == 1  # prefill 0 stays in C1 although its tok would not be larger


def fake_vllm() -> tuple[FastAPI, list[dict[str, Any]]]:
    app, seen = FastAPI(), []

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        text = body.get("prompt") or " ".join(m["content"] for m in body["messages"])
        return {"tokens": [ord(c) for c in text], "count": len(text)}

    async def answer(request: Request, kind: str) -> Any:
        body = await request.json()
        seen.append({"host": request.url.hostname, "kind": kind, "body": body})
        if body.get("stream"):

            async def events() -> Any:
                for word in ("a", "b"):
                    yield f"data: {json.dumps({'choices': [{'text': word}]})}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return {"host": request.url.hostname, "choices": [{"text": "ab"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await answer(request, "chat")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "tiny"}]}

    return app, seen


def test_the_router_forwards_with_its_choice_and_counts_back_to_zero(tmp_path: Path) -> None:
    ids = list(range(1, 130))
    store = FileStore(tmp_path, 2**30)
    for j, key in enumerate(block_keys(ids, 32)):
        store.put_full_block(key, bytes(64), num_layers=2, parent=block_keys(ids, 32)[j - 1] if j else None)
    upstream_app, seen = fake_vllm()
    upstream = httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream_app))
    router = Router(
        RouterConfig(prefill_urls=("http://p0", "http://p1"), de_endpoints=("d0",), store_dir=str(tmp_path)),
        client=upstream,
    )
    app = make_app(router)

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
            return [
                await c.post("/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 2}),
                await c.post("/v1/completions", json={"model": "tiny", "prompt": ids, "stream": True}),
                await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}),
                await c.get("/v1/models"),
                await c.post("/v1/completions", json={"prompt": [[1, 2], [3]]}),
            ]

    plain, streamed, chat, models, batch = asyncio.run(scenario())
    assert plain.status_code == 200 and plain.json()["host"] == "p0"
    assert streamed.status_code == 200 and streamed.text.count("data:") == 3
    assert chat.status_code == 200 and models.json()["data"][0]["id"] == "tiny"
    assert batch.status_code == 400 and "one prompt" in batch.json()["error"]["message"]
    hits = [p.hit_tokens for p in router.placements]
    assert hits == [128, 128, 0]  # 4 whole blocks stored; the last prompt token never counts
    sent = [s["body"]["kv_transfer_params"]["dualpath"]["read_path"] for s in seen]
    assert sent == ["pe", "pe", "pe"]  # one request at a time: every queue was empty when it came
    assert [s["body"]["prompt"] for s in seen[:2]] == [ids, ids]  # the body passes through unchanged
    stats = router.stats()
    assert stats["tok"] == [0, 0] and stats["pe_read_q_tokens"] == [0, 0] and stats["compute_tok"] == [0, 0]


@pytest.mark.parametrize("mode", ["basic", "dualpath"])
def test_concurrent_streams_spread_reads_in_dualpath_only(tmp_path: Path, mode: str) -> None:
    ids = list(range(1, 200))
    store = FileStore(tmp_path, 2**30)
    keys = block_keys(ids, 32)
    for j, key in enumerate(keys):
        store.put_full_block(key, bytes(64), num_layers=2, parent=keys[j - 1] if j else None)
    upstream_app, seen = fake_vllm()
    router = Router(
        RouterConfig(
            prefill_urls=("http://p0",), de_endpoints=("d0", "d1"), store_dir=str(tmp_path), mode=mode
        ),
        client=httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream_app)),
    )
    placements = [router.book.place(len(ids), router.hit_tokens(ids)) for _ in range(3)]  # all in flight
    sides = [p.read_path + p.de_endpoint for p in placements]
    assert sides == (["pe", "pe", "pe"] if mode == "basic" else ["pe", "ded0", "ded1"])


def fake_pd_instances() -> tuple[FastAPI, list[dict[str, Any]]]:
    """Prefill answers one token (42); decode answers 7, 8, … (streamed with usage when asked)."""
    app, seen = FastAPI(), []

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        seen.append({"host": request.url.hostname, "body": body})
        if body["max_tokens"] == 1:
            assert not body.get("stream")
            return {"id": "c1", "object": "text_completion", "created": 1, "model": "m",
                    "choices": [{"text": "", "token_ids": [42], "finish_reason": "length"}]}  # fmt: skip
        ids = list(range(7, 7 + body["max_tokens"]))
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}
        if not body.get("stream"):
            return {"choices": [{"text": "", "token_ids": ids}], "usage": usage,
                    "kv_transfer_params": {"dualpath": {"pd_loaded_tokens": len(body["prompt"]) - 1}}}  # fmt: skip

        async def events() -> Any:
            for token in ids:
                yield f"data: {json.dumps({'choices': [{'text': '', 'token_ids': [token]}]})}\n\n".encode()
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app, seen


def test_the_pd_hand_off_goes_prefill_then_decode_and_joins_the_answers() -> None:
    app_upstream, seen = fake_pd_instances()
    router = Router(
        RouterConfig(prefill_urls=("http://p0",), prefill_endpoints=("p0",), decode_urls=("http://e0",)),
        client=httpx.AsyncClient(transport=httpx.ASGITransport(app=app_upstream)),
    )
    ids = list(range(1, 50))

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=make_app(router)), base_url="http://r"
        ) as c:
            plain = await c.post("/v1/completions", json={"prompt": ids, "max_tokens": 3})
            body = {"prompt": ids, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
            streamed = await c.post("/v1/completions", json=body)
            return plain, streamed

    plain, streamed = asyncio.run(scenario())
    assert plain.json()["choices"][0]["token_ids"] == [42, 7, 8]
    assert plain.json()["usage"] == {"prompt_tokens": 49, "completion_tokens": 3, "total_tokens": 52}
    prefill, decode = seen[0]["body"], seen[1]["body"]
    assert (seen[0]["host"], seen[1]["host"]) == ("p0", "e0")
    assert prefill["max_tokens"] == 1 and prefill["kv_transfer_params"]["dualpath"]["pd"]["role"] == "prefill"
    pd = decode["kv_transfer_params"]["dualpath"]["pd"]
    assert pd == {"role": "decode", "job": prefill["kv_transfer_params"]["dualpath"]["pd"]["job"],
                  "prefill_endpoint": "p0", "tokens": 49}  # fmt: skip
    assert decode["prompt"] == [*ids, 42] and decode["max_tokens"] == 2
    assert router.handoffs == [{"dualpath": {"pd_loaded_tokens": 49}}]
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    tokens = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
    assert tokens == [42, 7, 8] and streamed.text.rstrip().endswith("data: [DONE]")
    assert events[-1]["usage"] == {"prompt_tokens": 49, "completion_tokens": 3, "total_tokens": 52}
    assert router.book.decode_tok == [0] and router.book.tok == [0]
