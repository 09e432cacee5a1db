"""`dualpath route`: an OpenAI-compatible proxy in front of vLLM instances that run DualPathConnector.

    client ──POST /v1/completions | /v1/chat/completions──► router
        router: prompt token ids (the body's, or the instance's /tokenize), hit length from the store,
                RouterBook.place (our policy code: Algorithm 1, ShorterQueue) ──► kv_transfer_params
        ──► the chosen vLLM instance, body unchanged but for kv_transfer_params["dualpath"]
        ◄── its answer, streamed through as it comes (usage included when the client asked for it)

The router keeps no engine state: vLLM batches and schedules inside each instance. Decode nodes appear by
their DE endpoint names (the `de_serve_endpoint` of their connector); they serve DE reads for the prefill
instances on their host.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dualpath.integrations.vllm.plan import hit_blocks
from dualpath.integrations.vllm.router_book import Placement, RouterBook
from dualpath.kvcache import FileStore
from dualpath.protocol import error_body

UPSTREAM_TIMEOUT_S = 600.0


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    prefill_urls: tuple[str, ...]  # base URLs of the vLLM instances, e.g. http://10.0.0.5:8000
    # PD hand-off (pd.py): decode instances' URLs, and each prefill instance's connector endpoint name
    decode_urls: tuple[str, ...] = ()
    prefill_endpoints: tuple[str, ...] = ()
    de_endpoints: tuple[str, ...] = ()
    mode: str = "dualpath"
    store_dir: str = ""  # the connectors' store directory (hit lengths); none: every request is a miss
    full_block_tokens: int = 32
    alpha_tokens: float = float("inf")
    beta_tokens: float = float("inf")
    read_tokens_per_s: float = 1.0
    extra_headers: dict[str, str] = field(default_factory=dict)


class Router:
    def __init__(self, config: RouterConfig, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.book = RouterBook(
            len(config.prefill_urls),
            list(config.de_endpoints),
            mode=config.mode,
            block_tokens=config.full_block_tokens,
            alpha_tokens=config.alpha_tokens,
            beta_tokens=config.beta_tokens,
            read_tokens_per_s=config.read_tokens_per_s,
            num_decode=len(config.decode_urls),
        )
        if config.decode_urls and len(config.prefill_endpoints) != len(config.prefill_urls):
            raise ValueError("the PD hand-off needs one connector endpoint name per prefill instance")
        self._jobs = itertools.count()
        # Capacity far above any real store: a router only looks; it must never evict on open.
        self.store = (
            FileStore(config.store_dir, 2**62, stale_tmp_s=float("inf")) if config.store_dir else None
        )
        self.client = client or httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT_S)
        self.placements: list[Placement] = []  # every decision, in order (tests, logs)
        self.handoffs: list[dict[str, Any]] = []  # the decode instances' kv_transfer_params, in order

    async def prompt_ids(self, kind: str, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if kind == "completions" and isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if kind == "completions" and isinstance(prompt, str):
            ask: dict[str, Any] = {"prompt": prompt}
        elif kind == "chat" and isinstance(body.get("messages"), list):
            ask = {"messages": body["messages"]}
        else:
            raise ValueError("the router takes one prompt per request: a string or a list of token ids")
        if "model" in body:
            ask["model"] = body["model"]
        answer = await self.client.post(f"{self.config.prefill_urls[0]}/tokenize", json=ask)
        answer.raise_for_status()
        return list(answer.json()["tokens"])

    def hit_tokens(self, ids: list[int]) -> int:
        if self.store is None:
            return 0
        store = self.store
        _, hit = hit_blocks(ids, self.config.full_block_tokens, lambda k: store.path_of(k).is_file())
        return hit * self.config.full_block_tokens

    async def route(self, kind: str, body: dict[str, Any]) -> Response:
        try:
            ids = await self.prompt_ids(kind, body)
        except ValueError as error:
            return JSONResponse(error_body(400, str(error)), status_code=400)
        if self.config.decode_urls:
            if kind != "completions":
                message = "with decode instances the router serves /v1/completions only"
                return JSONResponse(error_body(400, message), status_code=400)
            return await self._route_pd(ids, body)
        placement = self.book.place(len(ids), self.hit_tokens(ids))
        self.placements.append(placement)
        params = dict(body.get("kv_transfer_params") or {})
        params.update(placement.kv_transfer_params)
        body = body | {"kv_transfer_params": params}
        path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
        url = self.config.prefill_urls[placement.prefill] + path
        if body.get("stream"):
            return await self._stream(url, body, placement)
        try:
            answer = await self.client.post(url, json=body)
        finally:
            self.book.finished(placement, loaded=False)
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    async def _route_pd(self, ids: list[int], body: dict[str, Any]) -> Response:
        """Prefill on a prefill instance (1 token), then decode on a decode instance that loads its KV."""
        max_tokens = int(body.get("max_tokens") or 16)
        placement = self.book.place(len(ids), self.hit_tokens(ids))
        self.placements.append(placement)
        job = f"pd-{next(self._jobs)}"
        pd_prefill = placement.kv_transfer_params
        if max_tokens > 1:  # else the prefill instance answers alone and holds nothing
            pd_prefill["dualpath"]["pd"] = {"role": "prefill", "job": job}  # type: ignore[assignment]
        first_body = {k: v for k, v in body.items() if k != "stream_options"} | {
            "prompt": ids,
            "max_tokens": 1,
            "stream": False,
            "return_token_ids": True,
            "kv_transfer_params": pd_prefill,
        }
        try:
            first = await self.client.post(
                self.config.prefill_urls[placement.prefill] + "/v1/completions", json=first_body
            )
        finally:
            self.book.finished(placement, loaded=False)
        if first.status_code != 200:
            return Response(first.content, status_code=first.status_code, media_type="application/json")
        head = first.json()
        token = head["choices"][0]["token_ids"][0]
        if max_tokens == 1 or head["choices"][0].get("finish_reason") == "stop":
            return JSONResponse(head)
        decode = self.book.place_decode(len(ids) + max_tokens)
        pd_decode = {
            "role": "decode",
            "job": job,
            "prefill_endpoint": self.config.prefill_endpoints[placement.prefill],
            "tokens": len(ids),
        }
        rest_body = body | {
            "prompt": [*ids, token],
            "max_tokens": max_tokens - 1,
            "return_token_ids": True,
            "kv_transfer_params": {"dualpath": {"pd": pd_decode}},
        }
        url = self.config.decode_urls[decode] + "/v1/completions"
        if body.get("stream"):
            return await self._stream_pd(
                url,
                rest_body,
                head,
                len(ids),
                lambda: self.book.decode_finished(decode, len(ids) + max_tokens),
            )
        try:
            rest = await self.client.post(url, json=rest_body)
        finally:
            self.book.decode_finished(decode, len(ids) + max_tokens)
        if rest.status_code != 200:
            return Response(rest.content, status_code=rest.status_code, media_type="application/json")
        answer = rest.json()
        self.handoffs.append(answer.get("kv_transfer_params") or {})
        choice, first_choice = answer["choices"][0], head["choices"][0]
        choice["token_ids"] = [token, *(choice.get("token_ids") or [])]
        choice["text"] = (first_choice.get("text") or "") + (choice.get("text") or "")
        completion = 1 + int(answer["usage"]["completion_tokens"])
        answer["usage"] = {
            "prompt_tokens": len(ids),
            "completion_tokens": completion,
            "total_tokens": len(ids) + completion,
        }
        return JSONResponse(answer)

    async def _stream_pd(
        self,
        url: str,
        body: dict[str, Any],
        head: dict[str, Any],
        prompt_tokens: int,
        done: Callable[[], None],
    ) -> Response:
        """The first token (from the prefill instance) as one chunk, then the decode instance's stream, its
        usage counting the whole request."""
        upstream = await self.client.send(self.client.build_request("POST", url, json=body), stream=True)
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            done()
            return Response(content, status_code=upstream.status_code, media_type="application/json")
        first_choice = head["choices"][0]
        first = {k: head[k] for k in ("id", "object", "created", "model") if k in head} | {
            "choices": [
                {
                    "index": 0,
                    "text": first_choice.get("text") or "",
                    "token_ids": first_choice["token_ids"][:1],
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        }

        async def chunks() -> AsyncIterator[bytes]:
            try:
                yield f"data: {json.dumps(first)}\n\n".encode()
                async for line in upstream.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        yield b"data: [DONE]\n\n"
                        continue
                    event = json.loads(line[len("data: ") :])
                    if event.get("usage"):
                        completion = 1 + int(event["usage"].get("completion_tokens", 0))
                        event["usage"] = {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion,
                            "total_tokens": prompt_tokens + completion,
                        }
                    yield f"data: {json.dumps(event)}\n\n".encode()
            finally:
                await upstream.aclose()
                done()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def _stream(self, url: str, body: dict[str, Any], placement: Placement) -> Response:
        upstream = await self.client.send(self.client.build_request("POST", url, json=body), stream=True)
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            self.book.finished(placement, loaded=False)
            return Response(content, status_code=upstream.status_code, media_type="application/json")

        async def chunks() -> AsyncIterator[bytes]:
            loaded = False
            try:
                async for chunk in upstream.aiter_raw():
                    if not loaded and b"data:" in chunk:
                        self.book.loaded(placement)  # the first token: the hit is in and the prompt computed
                        loaded = True
                    yield chunk
            finally:
                await upstream.aclose()
                self.book.finished(placement, loaded=loaded)

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def models(self) -> Response:
        answer = await self.client.get(f"{self.config.prefill_urls[0]}/v1/models")
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    def stats(self) -> dict[str, Any]:
        b = self.book
        return {
            "mode": b.mode,
            "tok": b.tok,
            "compute_tok": b.compute_tok,
            "pe_read_q_tokens": b.pe_read_q,
            "de_read_q_tokens": b.de_read_q,
            "placed": len(self.placements),
            "de_reads": sum(p.read_path == "de" for p in self.placements if p.hit_tokens),
            "pe_reads": sum(p.read_path == "pe" for p in self.placements if p.hit_tokens),
        }


def make_app(router: Router) -> FastAPI:
    # The book is changed only between awaits, on the event loop's one thread: its counts stay consistent.
    app = FastAPI(title="dualpath route")

    async def body_of(request: Request) -> dict[str, Any] | Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(error_body(400, "the body is not JSON"), status_code=400)
        if not isinstance(body, dict):
            return JSONResponse(error_body(400, "the body must be a JSON object"), status_code=400)
        return body

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        return await router.route("completions", body)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        return await router.route("chat", body)

    @app.get("/v1/models")
    async def models() -> Response:
        return await router.models()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/router/stats")
    async def stats() -> dict[str, Any]:
        return router.stats()

    return app
