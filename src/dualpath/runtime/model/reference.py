"""The reference engine: the same model, in one process, KV reused from memory (no storage, no transport).

It is the oracle for the serving runtime: greedy outputs of the distributed data path (KV read back from
the store, moved layer by layer between processes, decoded in a batch) must equal `generate` token for
token. That holds bit-exactly on CPU in float32 because every path runs the batch-invariant kernels of
`numerics.py`; `reuse_block_tokens` additionally lets a caller mirror the store's Full Block
granularity exactly, so the same tokens are recomputed on both sides where the kernels are not
batch-invariant (CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dualpath.runtime.model.kv_layout import LayerKV
from dualpath.runtime.model.transformer import Transformer
from dualpath.runtime.sampling import SamplingParams, finish_reason, sample_next


@dataclass(frozen=True, kw_only=True)
class Generation:
    tokens: list[int]
    # Per layer, the KV of prompt + tokens[:-1]: every token that went through the model.
    kv: tuple[LayerKV, ...]
    hit_tokens: int  # prompt tokens whose KV came from the cache, not recomputed


class ReferenceEngine:
    def __init__(self, model: Transformer) -> None:
        self.model = model

    def recompute_kv(self, prompt_ids: Sequence[int]) -> tuple[LayerKV, ...]:
        """Per layer, the KV of all of `prompt_ids` from one full prefill (nothing cached)."""
        return self.model.prefill(prompt_ids).kv

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        cached_prefix_kv: Sequence[LayerKV] | None = None,
        *,
        stop_token_ids: Sequence[int] = (),
        sampling: SamplingParams | None = None,
    ) -> list[int]:
        """Greedy (or `sampling`'s) tokens for the full prompt `prompt_ids`; see `generate_with_kv`."""
        return self.generate_with_kv(
            prompt_ids, max_tokens, cached_prefix_kv, stop_token_ids=stop_token_ids, sampling=sampling
        ).tokens

    @torch.inference_mode()
    def generate_with_kv(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        cached_prefix_kv: Sequence[LayerKV] | None = None,
        *,
        stop_token_ids: Sequence[int] = (),
        sampling: SamplingParams | None = None,
    ) -> Generation:
        """Greedy decoding (ties go to the lowest id), at most `max_tokens` tokens.

        `cached_prefix_kv[layer]` holds the KV of `prompt_ids[:cached]`; only the rest is prefilled. A
        fully cached prompt still recomputes its last token, which yields the first logits. With
        `sampling`, every token is drawn as the serving nodes draw it (`runtime.sampling.sample_next`, the
        same seed per position) and the output ends by the same rule (`finish_reason`).
        """
        config = self.model.config
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        cached = 0 if cached_prefix_kv is None else cached_prefix_kv[0].shape[0]
        if cached > len(prompt_ids):
            raise ValueError(f"cached prefix has {cached} tokens, the prompt only {len(prompt_ids)}")
        hit = min(cached, len(prompt_ids) - 1)
        prefix = None if cached_prefix_kv is None or hit == 0 else [kv[:hit] for kv in cached_prefix_kv]
        prefill = self.model.prefill(prompt_ids[hit:], prefix)
        # One growing buffer per layer; contexts are views of its filled part.
        total = len(prompt_ids) + max_tokens - 1
        buffers = [
            torch.empty((total, config.kv_row_elems), dtype=config.torch_dtype, device=config.device)
            for _ in range(config.num_layers)
        ]
        for layer, buffer in enumerate(buffers):
            if prefix is not None:
                buffer[:hit] = prefix[layer]
            buffer[hit : len(prompt_ids)] = prefill.kv[layer]
        filled = len(prompt_ids)

        def draw(logits: torch.Tensor, tokens: list[int]) -> int:
            if sampling is None:
                return _greedy(logits)
            return sample_next(logits, sampling, tokens, position=len(prompt_ids) + len(tokens))

        def ended(tokens: list[int]) -> bool:
            if sampling is not None:
                return finish_reason(sampling, tokens, max_tokens) is not None
            return len(tokens) >= max_tokens or tokens[-1] in stop_token_ids

        tokens = [draw(prefill.logits[-1], [])]
        while not ended(tokens):
            step = self.model.decode_step([tokens[-1]], [[buffer[:filled] for buffer in buffers]])
            for layer, buffer in enumerate(buffers):
                buffer[filled] = step.kv[layer][0]
            filled += 1
            tokens.append(draw(step.logits[0], tokens))
        return Generation(
            tokens=tokens, kv=tuple(buffer[:filled].clone() for buffer in buffers), hit_tokens=hit
        )


class ReferenceSession:
    """A multi-round conversation (one agentic trajectory) that keeps earlier rounds' KV in memory.

    Round i's prompt is every earlier append and generation plus the new append (paper A.3); only the
    tokens past the reusable prefix are prefilled. `reuse_block_tokens=64` reuses whole blocks only, as
    a store of 64-token Full Blocks would.
    """

    def __init__(self, engine: ReferenceEngine, *, reuse_block_tokens: int = 1) -> None:
        if reuse_block_tokens < 1:
            raise ValueError(f"reuse_block_tokens must be >= 1, got {reuse_block_tokens}")
        self.engine = engine
        self.reuse_block_tokens = reuse_block_tokens
        self.history: list[int] = []
        self.kv: tuple[LayerKV, ...] | None = None
        self.last_hit_tokens = 0

    def run_round(self, append_ids: Sequence[int], max_tokens: int) -> list[int]:
        prompt = [*self.history, *append_ids]
        prefix = None
        if self.kv is not None:
            reusable = self.kv[0].shape[0] // self.reuse_block_tokens * self.reuse_block_tokens
            prefix = [kv[:reusable] for kv in self.kv] if reusable else None
        generation = self.engine.generate_with_kv(prompt, max_tokens, prefix)
        self.history = prompt + generation.tokens
        self.kv = generation.kv
        self.last_hit_tokens = generation.hit_tokens
        return generation.tokens


def _greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))
