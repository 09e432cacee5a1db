"""What the HTTP API hands a backend (`CompletionRequest`), what it gets back (`TokenChunk`), and the backend
contract (`CompletionBackend`: the scheduler process in production, a stub in tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    info: dict[str, Any] = field(default_factory=dict)  # path taken, cached tokens, ... (last chunk)


class CompletionBackend(Protocol):
    """Generation behind the API. Optional extras the API uses when present:

    - `chat_token_ids(messages, *, add_generation_prompt=True) -> list[int]`: the chat template applied and
      encoded (raises ValueError naming the problem); needed by /v1/chat/completions;
    - `cancel(request_id) -> None`: end a request early (a stop string matched), fire and forget;
    - `admission_error(prompt_tokens, max_tokens) -> str | None`: why a request can never be served.
    """

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
