"""Sampling parameters of one request (the OpenAI fields that change which token is drawn), the draw, and
the stop rule.

Plain data that crosses process boundaries as a JSON message: the API builds it from the request body, the
scheduler carries it to the nodes, and the node that produces a token draws it with `sample_next`. Sampling
runs where the token is produced: the decode node draws every token but the first, which the prefill node
draws from its last forward's logits with the same function (paper §4.1: the PE's last forward yields
token 1). Both nodes then agree on the request's stop rule (`finish_reason`).

NOTE: reproducible draws. Each draw has its own `torch.Generator`, seeded from (request seed, position of
the token in the sequence), and runs on the CPU in float64 over the float32 logits row. A token's logits do
not depend on the batch it was computed in (`model/numerics.py`), so the same seed gives the same tokens
whatever the batch, the node, the read path or the mode (basic, dualpath, oracle).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a token is drawn: the HTTP process only carries the params
    import torch


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
    # The served model's EOS ids: not an API field, the scheduler fills them from the tokenizer.
    eos_token_ids: tuple[int, ...] = ()

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
        message["eos_token_ids"] = list(self.eos_token_ids)
        return message

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> SamplingParams:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in message.items() if k in known}
        for name in ("stop_token_ids", "eos_token_ids"):
            if name in values:
                values[name] = tuple(int(t) for t in values[name])
        return cls(**values)

    def with_model(self, *, eos_token_ids: Sequence[int], seed: int) -> SamplingParams:
        """These params for one served request: the model's EOS ids, and `seed` when none was given."""
        return replace(
            self, eos_token_ids=tuple(eos_token_ids), seed=self.seed if self.seed is not None else seed
        )

    @property
    def finish_token_ids(self) -> frozenset[int]:
        """Tokens that end the output (once `min_tokens` are out): the stop ids, and EOS unless ignored."""
        eos = () if self.ignore_eos else self.eos_token_ids
        return frozenset((*self.stop_token_ids, *eos))


def sample_next(
    logits_row: torch.Tensor, params: SamplingParams, generated_ids: Sequence[int], position: int
) -> int:
    """The next token from one row of logits (`[vocab]`); `generated_ids` are the output tokens so far and
    `position` is the new token's position in the sequence (prompt tokens + `len(generated_ids)`).

    Order as vLLM applies it: presence/frequency penalties on the output tokens, EOS and stop ids masked
    while fewer than `min_tokens` are out, then greedy argmax (temperature 0: exactly `argmax` of the
    logits, ties to the lowest id), or temperature, top-k, top-p, min-p and one seeded draw.
    """
    import torch

    logits = logits_row.detach().to(device="cpu", dtype=torch.float32).reshape(-1)
    if params.presence_penalty or params.frequency_penalty:
        logits = _penalised(logits, params, generated_ids)
    if len(generated_ids) < params.min_tokens:
        masked = [t for t in params.finish_token_ids if 0 <= t < logits.shape[0]]
        if masked:
            logits = logits.clone()
            logits[masked] = float("-inf")
    if params.greedy:
        return int(torch.argmax(logits))
    probs = _filtered_probs(logits.double() / params.temperature, params)
    generator = torch.Generator(device="cpu").manual_seed(draw_seed(params.seed or 0, position))
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    cdf = probs.cumsum(0)
    index = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))
    # u * total < total, so the index lies in the vocabulary; a zero-probability token is never chosen
    # because its cdf step is empty.
    return min(index, probs.shape[0] - 1)


def draw_seed(seed: int, position: int) -> int:
    """A 63-bit generator seed for the draw at `position` of a request seeded `seed` (hash-mixed, so
    nearby seeds and positions give unrelated streams)."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def finish_reason(params: SamplingParams, generated_ids: Sequence[int], max_tokens: int) -> str | None:
    """Why the output ends after its last token, or None: "stop" (an EOS or stop token, once `min_tokens`
    tokens came before it), "length" (`max_tokens` reached). Stop wins when both hold, as in vLLM."""
    allowed = bool(generated_ids) and len(generated_ids) - 1 >= params.min_tokens
    if allowed and generated_ids[-1] in params.finish_token_ids:
        return "stop"
    if len(generated_ids) >= max_tokens:
        return "length"
    return None


def _penalised(logits: torch.Tensor, params: SamplingParams, generated_ids: Sequence[int]) -> torch.Tensor:
    import torch

    counts = torch.zeros_like(logits)
    ids = [t for t in generated_ids if 0 <= t < logits.shape[0]]
    if ids:
        counts.index_add_(0, torch.tensor(ids, dtype=torch.long), torch.ones(len(ids)))
    return logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()


def _filtered_probs(scaled: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Softmax of the scaled logits after top-k, top-p and min-p (float64, unnormalised zeros allowed)."""
    import torch

    if 0 < params.top_k < scaled.shape[0]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=0)
    if params.top_p < 1:
        # Keep the most likely tokens until their mass reaches top_p (the first always stays); ties are
        # ordered by id (stable sort), so the kept set never depends on the sort's internals.
        order = torch.sort(probs, descending=True, stable=True).indices
        sorted_probs = probs[order]
        before = sorted_probs.cumsum(0) - sorted_probs
        drop = order[before >= params.top_p]
        probs = probs.clone()
        probs[drop] = 0.0
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs
