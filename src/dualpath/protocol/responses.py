"""Response bodies of the OpenAI surface: whole responses, stream chunks, usage, the model list.

Shapes as OpenAI and vLLM send them. A completion choice carries `text`, a chat choice a `message`; stream
chunks carry `text` (completions) or `delta` (chat) and the `finish_reason` on the last one; with
`stream_options.include_usage` a final chunk with `choices: []` carries the `usage`.
"""

from __future__ import annotations

import json
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


def usage(*, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """`cached_tokens`: prompt tokens whose KV came from the store, not computed."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _envelope(request_id: str, obj: str, created: int, model: str) -> dict[str, Any]:
    return {"id": request_id, "object": obj, "created": created, "model": model}


def completion(
    *,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    usage_body: dict[str, Any],
    choice_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        **(choice_extra or {}),
    }
    return {
        **_envelope(request_id, "text_completion", created, model),
        "choices": [choice],
        "usage": usage_body,
    }


def chat_completion(
    *,
    request_id: str,
    created: int,
    model: str,
    content: str,
    finish_reason: str | None,
    usage_body: dict[str, Any],
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    return {
        **_envelope(request_id, "chat.completion", created, model),
        "choices": [choice],
        "usage": usage_body,
    }


def completion_chunk(
    *,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    choice_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        **(choice_extra or {}),
    }
    return {**_envelope(request_id, "text_completion", created, model), "choices": [choice]}


def chat_chunk(
    *, request_id: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {**_envelope(request_id, "chat.completion.chunk", created, model), "choices": [choice]}


def usage_chunk(
    *, request_id: str, obj: str, created: int, model: str, usage_body: dict[str, Any]
) -> dict[str, Any]:
    """The last chunk when `stream_options.include_usage` is set: no choices, the request's usage."""
    return {**_envelope(request_id, obj, created, model), "choices": [], "usage": usage_body}


def model_list(*, model: str, created: int, max_model_len: int) -> dict[str, Any]:
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "dualpath",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [card]}
