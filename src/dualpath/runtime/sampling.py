"""Sampling parameters of one request (the OpenAI fields that change which token is drawn).

Plain data that crosses process boundaries as a JSON message: the API builds it from the request body, the
scheduler carries it to the nodes, and the node that produces a token draws it with `sample_next`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """temperature 0 is greedy (argmax); top_k 0 and top_p 1 and min_p 0 switch those filters off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_message(self) -> dict[str, Any]:
        """A JSON-safe dict (tuples become lists)."""
        message = asdict(self)
        message["stop_token_ids"] = list(self.stop_token_ids)
        return message

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> SamplingParams:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in message.items() if k in known}
        if "stop_token_ids" in values:
            values["stop_token_ids"] = tuple(int(t) for t in values["stop_token_ids"])
        return cls(**values)
