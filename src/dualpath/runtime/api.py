"""The HTTP API (FastAPI): the OpenAI surface plus vLLM's extras, over a `CompletionBackend`.

    POST /v1/completions        POST /v1/chat/completions      GET /v1/models
    POST /tokenize              POST /detokenize               GET /version   GET /health   GET /metrics

Requests are validated with `dualpath.protocol` (shared with any other front end) and answered with its
response builders; generation happens in the backend (the scheduler process in production, a stub in
tests). Bad input is a 4xx whose body names the field, never a 5xx, and no error closes a keep-alive
connection (`_KeepAliveOnError`).

Extensions over the OpenAI schema (as vLLM offers them): `ignore_eos`, `min_tokens`, `top_k`, `min_p`,
`stop_token_ids`; a completions prompt as token ids; `token_ids` in every completions choice (clients
re-send the exact generated ids in the next round, since bytes need not round-trip through text, paper
A.3); `dualpath` (path taken, hit tokens, times) on the last chunk and in whole responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from importlib import metadata
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from dualpath.protocol import responses
from dualpath.protocol.errors import ProtocolError, error_body, validation_error
from dualpath.protocol.requests import (
    ChatCompletionBody,
    CompletionBody,
    DetokenizeBody,
    SamplingBody,
    TokenizeBody,
)
from dualpath.runtime.api_generation import Step, cached_tokens, generation_steps
from dualpath.runtime.api_types import CompletionBackend, CompletionRequest, TokenChunk
from dualpath.runtime.sampling import SamplingParams
from dualpath.runtime.spans import Spans

__all__ = ["CompletionBackend", "CompletionRequest", "TokenChunk", "build_app"]

log = logging.getLogger(__name__)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_SEED_MODULUS = 2**63  # int64 seeds map onto [0, 2^63) for the nodes' generators
_DISCONNECT_POLL_S = 0.5  # how often a whole (non-streamed) answer checks that its client is still there
_T = TypeVar("_T")


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param=param), status_code=status)


class _KeepAliveOnError:
    """Last-resort ASGI guard: an exception escaping the app becomes a 500 response (or ends a started body)
    instead of propagating to the server, which would drop the keep-alive connection."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = {"started": False, "done": False}

        async def tracked(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            return  # nobody to answer
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not state["started"]:
                response = _error(500, "internal error (logged by the server)")
                await response(scope, receive, send)
            elif not state["done"]:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


class _ClosingStreamingResponse(StreamingResponse):
    """Closes its body iterator however the stream ends (a client that left included), so the request's
    generator runs its cleanup (cancel in the cluster) at once rather than when collected."""

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


class _Api:
    """The routes' logic over one backend."""

    def __init__(self, backend: CompletionBackend) -> None:
        self.backend = backend
        self.started = int(time.time())
        self.spans: Spans = getattr(backend, "spans", None) or Spans("api")  # off unless profiling

    # ---- checks shared by the generating endpoints -------------------------------------------------
    def check_ready_and_model(self, model: str | None) -> None:
        if not self.backend.is_ready():
            raise ProtocolError(503, "the cluster is still starting; retry when GET /health says ok")
        served = self.backend.model_name
        if model is not None and model != served:
            raise ProtocolError(
                404, f"model: `{model}` does not exist; this server serves `{served}`", param="model"
            )

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.backend.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ProtocolError(
                400, f"{param}: token id {bad[0]} is outside the vocabulary [0, {vocab})", param=param
            )

    def tokenize(self, text: str, param: str, *, add_special_tokens: bool = True) -> list[int]:
        try:
            if add_special_tokens:
                return list(self.backend.tokenize(text))
            return list(self.backend.tokenize(text, add_special_tokens=False))  # type: ignore[call-arg]
        except (ValueError, UnicodeError) as error:
            raise ProtocolError(400, f"{param}: cannot be tokenized: {error}", param=param) from None

    def chat_ids(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> list[int]:
        render = getattr(self.backend, "chat_token_ids", None)
        if render is None:
            raise ProtocolError(
                404, "this server has no chat template: use /v1/completions", param="messages"
            )
        try:
            return list(render(messages, add_generation_prompt=add_generation_prompt))
        except (ValueError, UnicodeError) as error:
            raise ProtocolError(400, f"messages: {error}", param="messages") from None

    def max_tokens(self, body: SamplingBody, prompt_tokens: int, default: int | None) -> int:
        """Requested, else `default`, else the rest of the context as far as the cluster admits it; the
        whole must fit the context and the cluster (`admission_error`)."""
        context = self.backend.max_context_tokens
        if prompt_tokens >= context:
            raise ProtocolError(
                400,
                f"prompt: {prompt_tokens} tokens leave no room in the model's context of {context} tokens",
                param="prompt",
            )
        requested = body.requested_max_tokens()
        if requested is None and default is None:
            return self.largest_admitted(prompt_tokens, context - prompt_tokens)
        maximum = requested if requested is not None else int(default or 0)
        if prompt_tokens + maximum > context:
            raise ProtocolError(
                400,
                f"max_tokens: prompt ({prompt_tokens} tokens) + max_tokens ({maximum}) exceeds the model's "
                f"context of {context} tokens",
                param="max_tokens",
            )
        reason = self.admission_error(prompt_tokens, maximum)
        if reason:
            raise ProtocolError(400, reason, param="prompt")
        return maximum

    def admission_error(self, prompt_tokens: int, max_tokens: int) -> str | None:
        admission = getattr(self.backend, "admission_error", None)
        reason = admission(prompt_tokens, max_tokens) if admission is not None else None
        return str(reason) if reason else None

    def largest_admitted(self, prompt_tokens: int, limit: int) -> int:
        """The most output tokens up to `limit` the cluster admits (bisection: admission is monotone)."""
        if self.admission_error(prompt_tokens, limit) is None:
            return limit
        reason = self.admission_error(prompt_tokens, 1)
        if reason:
            raise ProtocolError(400, reason, param="prompt")
        low, high = 1, limit  # admitted, refused
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (
                (middle, high) if self.admission_error(prompt_tokens, middle) is None else (low, middle)
            )
        return low

    def sampling(self, body: SamplingBody) -> SamplingParams:
        fields = body.sampling_fields()
        fields["top_k"] = min(fields["top_k"], self.backend.vocab_size)
        if fields["seed"] is not None:
            fields["seed"] %= _SEED_MODULUS
        self.check_token_ids(list(fields["stop_token_ids"]), "stop_token_ids")
        try:
            return SamplingParams(**fields)
        except ValueError as error:
            raise ProtocolError(400, str(error)) from None

    def request(
        self, body: SamplingBody, ids: list[int], prefix: str, default_max: int | None
    ) -> CompletionRequest:
        body.check_supported()
        if not ids:
            raise ProtocolError(400, "prompt: is empty", param="prompt")
        self.check_token_ids(ids, "prompt")
        sampling = self.sampling(body)
        return CompletionRequest(
            request_id=f"{prefix}-{uuid.uuid4().hex[:16]}",
            prompt_token_ids=tuple(ids),
            max_tokens=self.max_tokens(body, len(ids), default_max),
            ignore_eos=body.ignore_eos,
            arrival_s=time.time(),
            sampling=sampling,
        )

    # ---- endpoints -------------------------------------------------------------------------------------
    async def completions(self, body: CompletionBody, raw: Request) -> Response:
        self.check_ready_and_model(body.model)
        with self.spans.span("api.validate"):
            prompt = body.single_prompt()
            ids = self.tokenize(prompt, "prompt") if isinstance(prompt, str) else list(prompt)
            request = self.request(body, ids, "cmpl", COMPLETIONS_DEFAULT_MAX_TOKENS)
        return await self._answer(body, request, raw, chat=False)

    async def chat(self, body: ChatCompletionBody, raw: Request) -> Response:
        self.check_ready_and_model(body.model)
        body.check_supported()
        ids = self.chat_ids(body.template_messages(), add_generation_prompt=body.add_generation_prompt)
        request = self.request(body, ids, "chatcmpl", None)
        return await self._answer(body, request, raw, chat=True)

    async def _answer(
        self, body: SamplingBody, request: CompletionRequest, raw: Request, *, chat: bool
    ) -> Response:
        stream = _Stream(self.backend.model_name, request, body, chat=chat, spans=self.spans)
        steps = generation_steps(self.backend, request, body.stop_strings(), spans=self.spans)
        if body.stream:
            return _ClosingStreamingResponse(stream.events(steps), media_type="text/event-stream")
        return JSONResponse(await _unless_disconnected(raw, stream.whole(steps)))

    def models(self) -> dict[str, Any]:
        return responses.model_list(
            model=self.backend.model_name, created=self.started, max_model_len=self.backend.max_context_tokens
        )

    def tokenize_endpoint(self, body: TokenizeBody) -> dict[str, Any]:
        self.check_ready_and_model(body.model)
        body.check_supported()
        if body.prompt is not None:
            ids = self.tokenize(body.prompt, "prompt", add_special_tokens=body.add_special_tokens)
        else:
            ids = self.chat_ids(body.template_messages(), add_generation_prompt=body.add_generation_prompt)
        return {"count": len(ids), "max_model_len": self.backend.max_context_tokens, "tokens": ids}

    def detokenize_endpoint(self, body: DetokenizeBody) -> dict[str, Any]:
        self.check_ready_and_model(body.model)
        self.check_token_ids(body.tokens, "tokens")
        return {"prompt": self.backend.detokenize(body.tokens)}


class _Stream:
    """Builds one request's answer (whole or streamed) from its generation steps."""

    def __init__(
        self, model: str, request: CompletionRequest, body: SamplingBody, *, chat: bool, spans: Spans
    ) -> None:
        self.model = model
        self.spans = spans
        self.request = request
        self.body = body
        self.chat = chat
        self.created = int(request.arrival_s)
        self.prompt_tokens = len(request.prompt_token_ids)

    def usage(self, step: Step) -> dict[str, Any]:
        return responses.usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=step.completion_tokens,
            cached_tokens=cached_tokens(step.info),
        )

    async def whole(self, steps: AsyncIterator[Step]) -> dict[str, Any]:
        text: list[str] = []
        ids: list[int] = []
        last = Step(text="", token_ids=[], completion_tokens=0)
        async for step in steps:
            text.append(step.text)
            ids.extend(step.token_ids)
            last = step
        common: dict[str, Any] = {
            "request_id": self.request.request_id,
            "created": self.created,
            "model": self.model,
        }
        if self.chat:
            out = responses.chat_completion(
                **common, content="".join(text), finish_reason=last.finish_reason, usage_body=self.usage(last)
            )
        else:
            out = responses.completion(
                **common,
                text="".join(text),
                finish_reason=last.finish_reason,
                usage_body=self.usage(last),
                choice_extra={"token_ids": ids},
            )
        out["dualpath"] = last.info
        return out

    async def events(self, steps: AsyncIterator[Step]) -> AsyncIterator[bytes]:
        """SSE chunks; a failure after the stream started becomes an error event, then [DONE]."""
        common: dict[str, Any] = {
            "request_id": self.request.request_id,
            "created": self.created,
            "model": self.model,
        }
        last: Step | None = None
        try:
            async for step in steps:
                if self.chat and last is None:  # the role, with the first output as vLLM sends it
                    role = {"role": "assistant", "content": ""}
                    yield responses.sse(responses.chat_chunk(**common, delta=role, finish_reason=None))
                last = step
                with self.spans.span("api.sse", request_id=self.request.request_id):
                    chunk = self.chunk(common, step)
                    data = None if chunk is None else responses.sse(chunk)
                if data is not None:
                    yield data
        except ProtocolError as error:  # after the stream started (a deadline passed): said in the stream
            yield responses.sse(error_body(error.status, error.message, param=error.param))
        except Exception:
            log.exception("stream of %s failed", self.request.request_id)
            yield responses.sse(error_body(500, "generation failed (logged by the server)"))
        finally:
            await steps.aclose()  # type: ignore[attr-defined]
        if last is not None and self.body.include_usage:
            obj = "chat.completion.chunk" if self.chat else "text_completion"
            yield responses.sse(responses.usage_chunk(**common, obj=obj, usage_body=self.usage(last)))
        yield responses.SSE_DONE

    def chunk(self, common: dict[str, Any], step: Step) -> dict[str, Any] | None:
        """A chunk per step (completions: also a text-less one, for its token ids); chat skips empty ones."""
        if self.chat:
            if not step.text and step.finish_reason is None:
                return None
            delta = {"content": step.text} if step.text or step.finish_reason is None else {}
            chunk = responses.chat_chunk(**common, delta=delta, finish_reason=step.finish_reason)
        else:
            chunk = responses.completion_chunk(
                **common,
                text=step.text,
                finish_reason=step.finish_reason,
                choice_extra={"token_ids": step.token_ids},
            )
        if self.body.continuous_usage:
            chunk["usage"] = self.usage(step)
        if step.finish_reason is not None:
            chunk["dualpath"] = step.info
        return chunk


async def _unless_disconnected(raw: Request, work: Coroutine[Any, Any, _T]) -> _T:
    """`work`'s result; a client that leaves first cancels it (and so the request in the cluster)."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if not task.done() and await raw.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ProtocolError(499, "the client closed the connection")
        return task.result()
    finally:
        task.cancel()


def _version() -> str:
    try:
        return metadata.version("dualpath")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_app(backend: CompletionBackend) -> FastAPI:
    app = FastAPI(title="DualPath", docs_url=None, redoc_url=None)
    api = _Api(backend)
    _add_error_handlers(app)
    app.add_middleware(_KeepAliveOnError)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = backend.is_ready()
        body = {"status": "ok" if ready else "starting", **(backend.health_info() if ready else {})}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(backend.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": _version()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return api.models()

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody, raw: Request) -> Response:
        return await api.completions(body, raw)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionBody, raw: Request) -> Response:
        return await api.chat(body, raw)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeBody) -> dict[str, Any]:
        return api.tokenize_endpoint(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeBody) -> dict[str, Any]:
        return api.detokenize_endpoint(body)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal in the protocol's error shape: validation (400 naming fields), ours, HTTP ones."""

    async def bad_body(_: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        refusal = validation_error(error.errors())
        return _error(refusal.status, refusal.message, refusal.param)

    async def refused(_: Request, error: Exception) -> Response:
        assert isinstance(error, ProtocolError)
        return _error(error.status, error.message, error.param)

    async def http_error(_: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        return _error(error.status_code, str(error.detail))

    handlers: dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
        RequestValidationError: bad_body,
        ProtocolError: refused,
        StarletteHTTPException: http_error,
    }
    for kind, handler in handlers.items():
        app.add_exception_handler(kind, handler)
