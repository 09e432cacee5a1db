"""The HTTP API: OpenAI-compatible `POST /v1/completions`, `GET /health`, `GET /metrics` (FastAPI).

The app only validates and translates; generation happens in a `CompletionBackend` (the scheduler process
in production, a stub in tests). Bad input is a 4xx whose body names what is wrong — never a 500.

Extensions over the OpenAI schema (as vLLM offers them): `ignore_eos` (the load generator asks for exactly a
round's generated-token count, paper A.3) and `token_ids` in every choice (clients re-send the exact
generated ids in the next round, since bytes need not round-trip through text).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from dualpath.runtime.sampling import SamplingParams


@dataclass(frozen=True, kw_only=True)
class CompletionRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool
    arrival_s: float  # wall clock (time.time) at the API
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True, kw_only=True)
class TokenChunk:
    """Newly generated tokens of one request; `finish_reason` set on the last chunk."""

    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # path taken, hit tokens, ... (last chunk)


class CompletionBackend(Protocol):
    @property
    def model_name(self) -> str: ...

    @property
    def max_context_tokens(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, token_ids: list[int]) -> str: ...

    def is_ready(self) -> bool: ...

    def health_info(self) -> dict[str, Any]: ...

    def metrics_text(self) -> bytes: ...

    def generate(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]: ...


class CompletionBody(BaseModel):
    """The subset of the OpenAI completions request we honour; unknown fields are rejected by name."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | list[StrictInt]
    max_tokens: StrictInt = Field(default=16, ge=1)
    stream: bool = False
    ignore_eos: bool = False
    model: str | None = None
    temperature: float | None = None
    n: StrictInt = 1
    user: str | None = None


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return JSONResponse(body, status_code=status)


def _prompt_ids(body: CompletionBody, backend: CompletionBackend) -> list[int]:
    ids = backend.tokenize(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    if not ids:
        raise ApiError(400, "prompt is empty")
    bad = [t for t in ids if not 0 <= t < backend.vocab_size]
    if bad:
        raise ApiError(400, f"token id {bad[0]} is outside the vocabulary [0, {backend.vocab_size})")
    if len(ids) + body.max_tokens > backend.max_context_tokens:
        raise ApiError(
            400,
            f"prompt ({len(ids)} tokens) + max_tokens ({body.max_tokens}) exceeds the model's context of "
            f"{backend.max_context_tokens} tokens",
        )
    return ids


def _validate(body: CompletionBody, backend: CompletionBackend) -> CompletionRequest:
    if body.temperature not in (None, 0, 0.0):
        raise ApiError(400, "only greedy decoding is served: set temperature to 0 or leave it out")
    if body.n != 1:
        raise ApiError(400, "only n = 1 is served")
    ids = _prompt_ids(body, backend)
    return CompletionRequest(
        request_id=f"cmpl-{uuid.uuid4().hex[:16]}",
        prompt_token_ids=tuple(ids),
        max_tokens=body.max_tokens,
        ignore_eos=body.ignore_eos,
        arrival_s=time.time(),
    )


def _choice(backend: CompletionBackend, chunk: TokenChunk, ids: list[int]) -> dict[str, Any]:
    return {
        "index": 0,
        "text": backend.detokenize(ids),
        "token_ids": ids,
        "finish_reason": chunk.finish_reason,
    }


async def _stream(backend: CompletionBackend, request: CompletionRequest) -> AsyncIterator[bytes]:
    async for chunk in backend.generate(request):
        ids = list(chunk.token_ids)
        event: dict[str, Any] = {
            "id": request.request_id,
            "object": "text_completion",
            "model": backend.model_name,
            "choices": [_choice(backend, chunk, ids)],
        }
        if chunk.finish_reason is not None:
            event["dualpath"] = chunk.info
        yield f"data: {json.dumps(event)}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def _complete(backend: CompletionBackend, request: CompletionRequest) -> dict[str, Any]:
    ids: list[int] = []
    last = TokenChunk(token_ids=())
    async for chunk in backend.generate(request):
        ids.extend(chunk.token_ids)
        last = chunk
    n_prompt = len(request.prompt_token_ids)
    return {
        "id": request.request_id,
        "object": "text_completion",
        "created": int(request.arrival_s),
        "model": backend.model_name,
        "choices": [_choice(backend, last, ids)],
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": len(ids),
            "total_tokens": n_prompt + len(ids),
        },
        "dualpath": last.info,
    }


def build_app(backend: CompletionBackend) -> FastAPI:
    app = FastAPI(title="DualPath", docs_url=None, redoc_url=None)

    @app.exception_handler(RequestValidationError)
    async def _bad_body(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
            for e in error.errors()
        )
        return _error(422, problems or "malformed request body")

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, error: ApiError) -> JSONResponse:
        return _error(error.status, error.message)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = backend.is_ready()
        body = {"status": "ok" if ready else "starting", **(backend.health_info() if ready else {})}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(backend.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody) -> JSONResponse | StreamingResponse:
        if not backend.is_ready():
            raise ApiError(503, "the cluster is still starting; retry when GET /health says ok")
        request = _validate(body, backend)
        if body.stream:
            return StreamingResponse(_stream(backend, request), media_type="text/event-stream")
        return JSONResponse(await _complete(backend, request))

    return app
