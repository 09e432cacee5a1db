"""Moving one Layer Block between vLLM's paged KV cache and raw bytes (no relayout, no pickle).

vLLM hands each attention layer's cache as a view whose first axis is the block: `kv_layer[block_id]` is one
vLLM block of that layer in the backend's own layout (CPU: [kv_heads, 2·block_tokens, head_dim] with K then V;
other backends differ). A Layer Block of a Full Block of m vLLM blocks is the bytes of `kv_layer[ids]` for its m
ids, in that order, so every engine instance with the same model and backend reads back exactly what another
wrote. The Full Block on storage is Layer Block 0 ‖ ... ‖ Layer Block L-1 (dualpath.kvcache.layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def layer_block_bytes(kv_layer: torch.Tensor, vllm_blocks: int) -> int:
    """Bytes of one Layer Block of `vllm_blocks` vLLM blocks of this layer."""
    return vllm_blocks * kv_layer[0].numel() * kv_layer.element_size()


def read_layer_block(kv_layer: torch.Tensor, block_ids: Sequence[int]) -> torch.Tensor:
    """The Layer Block as a contiguous uint8 CPU tensor (a copy: the paged blocks may be reused after)."""
    data = kv_layer[list(block_ids)].contiguous()
    return data.cpu().view(torch.uint8).reshape(-1) if data.is_cuda else data.view(torch.uint8).reshape(-1)


def write_layer_block(kv_layer: torch.Tensor, block_ids: Sequence[int], data: memoryview) -> None:
    """Copy a Layer Block's bytes into the paged cache at `block_ids`."""
    shape = (len(block_ids), *kv_layer.shape[1:])
    src = torch.frombuffer(data, dtype=kv_layer.dtype, count=int(torch.Size(shape).numel())).view(shape)
    kv_layer[list(block_ids)] = src.to(kv_layer.device, non_blocking=False)


def full_block(kv_layers: Sequence[torch.Tensor], block_ids: Sequence[int]) -> bytes:
    """A Full Block (all layers, in layer order) gathered from the paged cache."""
    return b"".join(read_layer_block(layer, block_ids).numpy().tobytes() for layer in kv_layers)
