"""The KV layout: one token of one layer is one contiguous row, so a Layer Block is a tensor view.

    row (kv_bytes_per_token_per_layer bytes, model dtype):
        | K head 0 | K head 1 | ... | K head h-1 | V head 0 | ... | V head h-1 |
          <-------- kv_heads x head_dim ------->  <------ kv_heads x head_dim ->

    Layer Block [1,      tokens, bytes]   = LayerKV[tokens, row]       (paper §4.1)
    Full Block  [layers, tokens, bytes]   = Layer Blocks stacked, layer-major, no relayout

K is stored after RoPE (as vLLM does), so a cached row is used as is. A `LayerKV` is simply a
`torch.Tensor[tokens, kv_row_elems]`; moving it as bytes is a reinterpretation, never a conversion.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from dualpath.runtime.model.config import TransformerConfig

LayerKV = torch.Tensor  # [tokens, kv_row_elems] in the model dtype


def pack_kv(keys: torch.Tensor, values: torch.Tensor) -> LayerKV:
    """`[tokens, kv_heads, head_dim]` K and V -> one `[tokens, 2 * kv_heads * head_dim]` row each."""
    return torch.cat([keys.flatten(1), values.flatten(1)], dim=1)


def unpack_kv(kv: LayerKV, config: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack_kv` as views: `(keys, values)`, each `[tokens, kv_heads, head_dim]`."""
    tokens = kv.shape[0]
    keys = kv[:, : config.kv_dim].view(tokens, config.num_kv_heads, config.head_dim)
    values = kv[:, config.kv_dim :].view(tokens, config.num_kv_heads, config.head_dim)
    return keys, values


def layer_kv_to_bytes(kv: LayerKV) -> memoryview:
    """The Layer Block's bytes, without copying when `kv` is a contiguous CPU tensor.

    A GPU tensor is copied to host memory once (the D2H of the data path). The view keeps the tensor
    alive; the caller must not modify `kv` while it holds the view.
    """
    host = kv.detach().contiguous().cpu()
    # Reinterpret as bytes through uint8 (numpy cannot hold bfloat16); zero-copy on a contiguous tensor.
    return host.view(torch.uint8).reshape(-1).numpy().data.cast("B")


def layer_kv_from_buffer(
    buffer: bytes | bytearray | memoryview, tokens: int, config: TransformerConfig, *, offset_bytes: int = 0
) -> LayerKV:
    """A `[tokens, kv_row_elems]` tensor over `buffer` (zero-copy, `torch.frombuffer`).

    `buffer` may be longer (e.g. a whole Full Block); `offset_bytes` selects the Layer Block. The tensor
    shares memory with `buffer`: it is read-only when `buffer` is `bytes`; copy it (or move it to the
    device) before the buffer is reused. The tensor lives on the CPU; `.to(config.device)` is the H2D.
    """
    count = tokens * config.kv_row_elems
    needed_bytes = offset_bytes + tokens * config.kv_bytes_per_token_per_layer
    if len(memoryview(buffer).cast("B")) < needed_bytes:
        raise ValueError(f"buffer holds {len(memoryview(buffer).cast('B'))} bytes, need {needed_bytes}")
    if count == 0:
        return torch.empty((0, config.kv_row_elems), dtype=config.torch_dtype)
    flat = _frombuffer(buffer, dtype=config.torch_dtype, count=count, offset=offset_bytes)
    return flat.view(tokens, config.kv_row_elems)


def _frombuffer(
    buffer: bytes | bytearray | memoryview, *, dtype: torch.dtype, count: int, offset: int
) -> torch.Tensor:
    with warnings.catch_warnings():
        # torch warns that a read-only buffer gives a non-writable tensor; that is the documented contract.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset)


def full_block_to_bytes(layer_blocks: Sequence[LayerKV]) -> bytes:
    """Concatenate one block's Layer Blocks (layer 0 first) into Full Block bytes."""
    return b"".join(bytes(layer_kv_to_bytes(kv)) for kv in layer_blocks)


def layer_block_offset_bytes(layer: int, tokens: int, config: TransformerConfig) -> int:
    """Where layer `layer`'s Layer Block starts inside a Full Block of `tokens` tokens."""
    return layer * tokens * config.kv_bytes_per_token_per_layer
