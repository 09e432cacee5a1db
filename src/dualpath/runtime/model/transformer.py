"""The decoder with a per-layer API, so that the runtime can run layerwise prefill (paper §4.1).

NOTE: layerwise prefill. A PE computes layer i only when layer i's Layer Blocks (the cached prefix KV)
are in device memory, and ships layer i's KV out right after, so load, compute and transfer overlap:

    load  | L0 | L1 | L2 | ...
    comp       | L0 | L1 | L2 | ...
    xfer            | L0 | L1 | ...

`embed` -> `prefill_layer(0..L-1)` -> `final` is that loop, one call per layer; `prefill` runs it in one
go. `decode_step` advances a batch of sequences with different context lengths by one token each
(continuous batching). Every path goes through the batch-invariant kernels in `numerics.py`, so a
token's KV and logits are the same bits whichever path computed it (on CPU, float32).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dualpath.runtime.model.config import TransformerConfig
from dualpath.runtime.model.kv_layout import LayerKV, pack_kv
from dualpath.runtime.model.numerics import (
    KEY_TILE_TOKENS,
    apply_rope,
    attend,
    linear,
    rms_norm,
    rope_tables,
    silu,
    tiled_kv,
)
from dualpath.runtime.model.weights import LayerWeights, ModelWeights, check_weights, random_weights

if TYPE_CHECKING:
    from dualpath.runtime.model.paged_cache import PagedKVCache

TokenIds = Sequence[int] | torch.Tensor


@dataclass(frozen=True, kw_only=True)
class PrefillOutput:
    logits: torch.Tensor  # float32 [1, vocab] (last token) or [new_tokens, vocab]
    kv: tuple[LayerKV, ...]  # per layer: the new tokens' KV [new_tokens, kv_row_elems]


@dataclass(frozen=True, kw_only=True)
class DecodeOutput:
    logits: torch.Tensor  # float32 [batch, vocab]
    kv: tuple[LayerKV, ...]  # per layer: each sequence's new-token KV row [batch, kv_row_elems]


class Transformer:
    """A Llama/Qwen2-style decoder in plain PyTorch (inference only, no autograd)."""

    def __init__(self, config: TransformerConfig, weights: ModelWeights) -> None:
        check_weights(config, weights)
        self.config = config
        self.weights = weights
        self._cos, self._sin = rope_tables(
            config.head_dim,
            config.max_position_tokens,
            config.rope_theta,
            device=config.device,
            dtype=config.torch_dtype,
        )

    @classmethod
    def random(cls, config: TransformerConfig, *, seed: int = 0) -> Transformer:
        return cls(config, random_weights(config, seed=seed))

    # -- the layerwise API -------------------------------------------------------------------------

    @torch.inference_mode()
    def embed(self, token_ids: TokenIds) -> torch.Tensor:
        """`[tokens, hidden]` embeddings of `token_ids`."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.config.device).reshape(-1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got {ids.tolist()[:8]}..."
            )
        return self.weights.embed.index_select(0, ids)

    @torch.inference_mode()
    def prefill_layer(
        self,
        layer: int,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cached_kv: LayerKV | None,
    ) -> tuple[torch.Tensor, LayerKV]:
        """Run layer `layer` for new tokens over a cached prefix.

        hidden: `[new, hidden]`; positions: `[new]`, the absolute positions `cached..cached+new-1`;
        cached_kv: this layer's KV of positions `0..cached-1` (`[cached, kv_row_elems]`) or None.
        Returns the new hidden states and this layer's KV of the new tokens (a Layer Block's rows).
        """
        weights = self.weights.layers[layer]
        cached_tokens = 0 if cached_kv is None else cached_kv.shape[0]
        self._check_positions(positions, hidden.shape[0], cached_tokens)
        q, new_kv = self._project(weights, hidden, positions)
        kv = tiled_kv([new_kv] if cached_kv is None else [cached_kv, new_kv])
        return self._finish(weights, hidden, attend(q, kv, positions)), new_kv

    @torch.inference_mode()
    def final(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits `[tokens, vocab]` from the last layer's hidden states."""
        normed = rms_norm(hidden, self.weights.final_norm, self.config.rms_eps)
        return linear(normed, self.weights.lm_head).float()

    # -- conveniences built on it ------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(
        self,
        token_ids: TokenIds,
        cached_kv: Sequence[LayerKV] | None = None,
        *,
        all_logits: bool = False,
    ) -> PrefillOutput:
        """Prefill `token_ids` (the new tokens only) over an optional cached prefix (per-layer KV)."""
        hidden = self.embed(token_ids)
        if hidden.shape[0] == 0:
            raise ValueError("prefill needs at least one new token")
        if cached_kv is not None and len(cached_kv) != self.config.num_layers:
            raise ValueError(f"cached_kv has {len(cached_kv)} layers, the model has {self.config.num_layers}")
        cached_tokens = 0 if cached_kv is None else cached_kv[0].shape[0]
        positions = torch.arange(cached_tokens, cached_tokens + hidden.shape[0], device=self.config.device)
        new_kv = []
        for layer in range(self.config.num_layers):
            hidden, layer_kv = self.prefill_layer(
                layer, hidden, positions, None if cached_kv is None else cached_kv[layer]
            )
            new_kv.append(layer_kv)
        logits = self.final(hidden if all_logits else hidden[-1:])
        return PrefillOutput(logits=logits, kv=tuple(new_kv))

    @torch.inference_mode()
    def decode_step(self, token_ids: TokenIds, contexts: Sequence[Sequence[LayerKV]]) -> DecodeOutput:
        """One decode step for a batch of sequences with different context lengths.

        token_ids[i] is sequence i's newest token; contexts[i][layer] is its KV of positions
        `0..len-1` (the new token sits at position len). Linear layers run batched; attention runs per
        sequence over its own context. The caller appends `DecodeOutput.kv[layer][i]` to sequence i.
        """
        if len(token_ids) != len(contexts):
            raise ValueError(f"{len(token_ids)} tokens but {len(contexts)} contexts")

        def tiled(index: int, layer: int, new_row: LayerKV) -> torch.Tensor:
            return tiled_kv([contexts[index][layer], new_row])

        return self._decode(token_ids, [context[0].shape[0] for context in contexts], tiled)

    @torch.inference_mode()
    def decode_step_paged(
        self, cache: PagedKVCache, seq_ids: Sequence[Hashable], token_ids: Sequence[int]
    ) -> torch.Tensor:
        """`decode_step` over sequences held in `cache`; appends each new token's KV; returns logits.

        Each sequence's context goes from its pages straight into attention's key tiles (one gather per
        layer, `PagedKVCache.tiled_rows`), the same rows `decode_step` tiles from a list.
        Raises MemoryError before computing anything if the cache cannot take one more token for all.
        """
        lengths = [cache.num_tokens(seq_id) for seq_id in seq_ids]
        needed_pages = sum(length % cache.block_tokens == 0 for length in lengths)
        if needed_pages > cache.num_free_pages:
            raise MemoryError(f"decode step needs {needed_pages} new pages, {cache.num_free_pages} are free")
        pages = [cache.page_index(seq_id) for seq_id in seq_ids]  # once per step, not per layer

        def tiled(index: int, layer: int, new_row: LayerKV) -> torch.Tensor:
            return cache.tiled_rows(pages[index], lengths[index], layer, new_row, KEY_TILE_TOKENS)

        output = self._decode(token_ids, lengths, tiled)
        for index, seq_id in enumerate(seq_ids):
            cache.append(seq_id, [layer_kv[index : index + 1] for layer_kv in output.kv])
        return output.logits

    def _decode(
        self,
        token_ids: TokenIds,
        lengths: Sequence[int],
        tiled: Callable[[int, int, LayerKV], torch.Tensor],
    ) -> DecodeOutput:
        """One step of sequences with `lengths` cached tokens; `tiled(i, layer, new_row)` gives sequence i's
        key tiles of one layer: its context, then the new token's row, then zero rows (`tiled_kv`)."""
        hidden = self.embed(token_ids)
        positions = torch.tensor(list(lengths), dtype=torch.long, device=self.config.device)
        new_kv = []
        for layer in range(self.config.num_layers):
            weights = self.weights.layers[layer]
            q, layer_kv = self._project(weights, hidden, positions)
            outputs = []
            for index in range(len(lengths)):
                kv = tiled(index, layer, layer_kv[index : index + 1])
                outputs.append(attend(q[index : index + 1], kv, positions[index : index + 1]))
            hidden = self._finish(weights, hidden, torch.cat(outputs))
            new_kv.append(layer_kv)
        return DecodeOutput(logits=self.final(hidden), kv=tuple(new_kv))

    # -- pieces --------------------------------------------------------------------------------------

    def _project(
        self, weights: LayerWeights, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, LayerKV]:
        """Rotated queries `[n, heads, head_dim]` and the new tokens' packed KV rows."""
        config, tokens = self.config, hidden.shape[0]
        x = rms_norm(hidden, weights.input_norm, config.rms_eps)
        q = linear(x, weights.q_w, weights.q_b).view(tokens, config.num_heads, config.head_dim)
        k = linear(x, weights.k_w, weights.k_b).view(tokens, config.num_kv_heads, config.head_dim)
        v = linear(x, weights.v_w, weights.v_b).view(tokens, config.num_kv_heads, config.head_dim)
        cos, sin = self._cos[positions], self._sin[positions]
        return apply_rope(q, cos, sin), pack_kv(apply_rope(k, cos, sin), v)

    def _finish(self, weights: LayerWeights, hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, then the SwiGLU MLP and its residual."""
        hidden = hidden + linear(attention, weights.o_w)
        x = rms_norm(hidden, weights.post_norm, self.config.rms_eps)
        gated = silu(linear(x, weights.gate_w)) * linear(x, weights.up_w)
        return hidden + linear(gated, weights.down_w)

    def _check_positions(self, positions: torch.Tensor, new_tokens: int, cached_tokens: int) -> None:
        if positions.shape != (new_tokens,):
            raise ValueError(f"positions must have shape ({new_tokens},), got {tuple(positions.shape)}")
        if cached_tokens + new_tokens > self.config.max_position_tokens:
            raise ValueError(
                f"{cached_tokens + new_tokens} tokens exceed max_position_tokens={self.config.max_position_tokens}"
            )
