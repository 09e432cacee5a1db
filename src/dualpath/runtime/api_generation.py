"""One request's generation as the HTTP API sees it: token chunks in, text steps with finish reasons out.

The backend streams token ids; here they become text (incremental detokenization), stop strings are found
and trimmed from the text, and a request that stops on a stop string is cancelled in the cluster
(`backend.cancel`), then drained until its last chunk, which carries the request's `info` (cached tokens,
path taken). Leaving early (a client that disconnects) closes the backend's stream, which cancels there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from dualpath.protocol.text import IncrementalDetokenizer, StopStringMatcher
from dualpath.runtime.api_types import CompletionBackend, CompletionRequest, TokenChunk
from dualpath.runtime.spans import Spans

_DRAIN_AFTER_CANCEL_S = 5.0  # the final chunk of a cancelled request (its info) comes within this


@dataclass(kw_only=True)
class Step:
    """New text and token ids since the last step; `finish_reason` and `info` on the last one."""

    text: str
    token_ids: list[int]
    completion_tokens: int  # generated so far, stop-string tokens included
    finish_reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


async def generation_steps(
    backend: CompletionBackend,
    request: CompletionRequest,
    stops: Sequence[str],
    *,
    spans: Spans | None = None,
) -> AsyncIterator[Step]:
    """Text steps of one request, ending with a step that has a finish reason ("stop" or "length");
    `spans` times each chunk's detokenization (profiling)."""
    spans = spans or Spans("api")
    detokenizer = IncrementalDetokenizer(backend.detokenize, request.prompt_token_ids)
    matcher = StopStringMatcher(stops)
    generated = 0
    stream = cast(AsyncGenerator[TokenChunk, None], backend.generate(request))  # backends write generators
    async with contextlib.aclosing(stream) as chunks:
        async for chunk in chunks:
            ids = list(chunk.token_ids)
            generated += len(ids)
            with spans.span("api.detokenize", request_id=request.request_id, tokens=len(ids)):
                delta = detokenizer.push(ids)
            # stop strings count from min_tokens on, as EOS and stop ids do (vLLM)
            text = matcher.feed(delta) if generated > request.sampling.min_tokens else delta
            if chunk.finish_reason is None and not matcher.stopped:
                yield Step(text=text, token_ids=ids, completion_tokens=generated)
                continue
            if not matcher.stopped:  # the cluster finished (length, EOS, a stop token id)
                text += matcher.feed(detokenizer.flush())
                text += matcher.flush()
            if matcher.stopped:
                info = (
                    chunk.info if chunk.finish_reason is not None else await _cancel(backend, request, chunks)
                )
                yield Step(
                    text=text, token_ids=ids, completion_tokens=generated, finish_reason="stop", info=info
                )
                return
            reason = str(chunk.finish_reason)
            yield Step(
                text=text, token_ids=ids, completion_tokens=generated, finish_reason=reason, info=chunk.info
            )
            return


async def _cancel(
    backend: CompletionBackend, request: CompletionRequest, chunks: AsyncIterator[Any]
) -> dict[str, Any]:
    """End the request in the cluster (a stop string matched); its last chunk's info, if it comes soon."""
    cancel = getattr(backend, "cancel", None)
    if cancel is None:
        return {}
    cancel(request.request_id)

    async def last_info() -> dict[str, Any]:
        async for chunk in chunks:
            if chunk.finish_reason is not None:
                return dict(chunk.info)
        return {}

    try:
        return await asyncio.wait_for(last_info(), _DRAIN_AFTER_CANCEL_S)
    except TimeoutError:
        return {}


def cached_tokens(info: dict[str, Any]) -> int:
    """Prompt tokens served from the store (the usable hit after any bad block), from the last chunk."""
    value = info.get("cached_tokens", info.get("effective_hit_tokens", 0))
    return int(value) if isinstance(value, int | float) else 0
