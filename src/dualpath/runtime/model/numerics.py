"""Batch-invariant kernels: a token's result does not depend on what else is in the batch.

NOTE: why this file exists. The runtime's correctness check compares greedy tokens of the distributed
data path (layerwise prefill on a PE with KV read from storage, decode on a DE batched with other
sequences) against an in-process reference. Those two compute the same token in batches of different
shapes: the PE may prefill a prompt in chunks (§6.4 chunked prefill) or with a block-aligned cache hit,
the DE decodes it beside other sequences. Plain PyTorch is not invariant to that: a GEMM picks a
different kernel (and so a different reduction order) for a different number of rows, and a softmax over
a longer, masked row groups its sum differently. So every op below is written so that one token's bits
depend only on its own inputs:

    linear     rows padded to a multiple of ROW_TILE_ROWS: measured on MKL sgemm, row-count changes
               below 8 rows switch kernels; at >= 8 rows, padded to a multiple of 8, the bits of a row
               do not depend on the row count (tests/runtime/test_model_invariance.py guards this)
    rms_norm   x / sqrt(mean(x^2) + eps): sqrt and division are correctly rounded everywhere, unlike
               rsqrt, whose vector and scalar-tail paths differ in the last bit
    silu       x / (1 + exp(-x)) for the same reason (torch's sigmoid has a different scalar tail)
    attention  keys in fixed tiles of KEY_TILE_TOKENS; each tile is one GEMM of a fixed shape; tiles are
               summed one after another in key order, so masked (future or padding) keys add exact
               zeros; the softmax denominator rides along as a column of ones in V (same GEMM, same
               order) instead of a separate reduction whose grouping depends on row length

With these, prefill in one shot, prefill in chunks over a cached prefix, and token-by-token decode
batched with any other sequences produce bit-identical KV and logits on CPU in float32. On CUDA the
GEMM kernels are chosen by cuBLAS heuristics and the guarantee is not verified; expect agreement within
float tolerance there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Row-count granularity for every GEMM (measured on this project's CPU build: MKL 2024.2, AVX-512).
ROW_TILE_ROWS = 8
# Keys per attention tile: one fixed GEMM shape for every tile, whatever the context length.
KEY_TILE_TOKENS = 128
# Query rows per attention pass: bounds the score tensor to rows x context (memory, not numerics).
QUERY_CHUNK_ROWS = 256


def pad_rows(x: torch.Tensor, multiple: int = ROW_TILE_ROWS) -> torch.Tensor:
    """`x` with zero rows appended so that its row count is a positive multiple of `multiple`."""
    rows = x.shape[0]
    padded = max(multiple, -(-rows // multiple) * multiple)
    if padded == rows:
        return x
    return torch.cat([x, x.new_zeros((padded - rows, *x.shape[1:]))])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` with the row count padded, so each row's result is independent of the others."""
    return F.linear(pad_rows(x), weight, bias)[: x.shape[0]]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (as Hugging Face Llama does), cast back to the input dtype."""
    x32 = x.float()
    scale = torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x32 / scale).to(x.dtype) * weight


def silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def rope_tables(
    head_dim: int, max_positions: int, theta: float, *, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables `[max_positions, head_dim]` (HF Llama's non-interleaved RoPE).

    Computed once on the CPU in float64 and then cast, so every device sees the same table.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x[tokens, heads, head_dim]` by per-token `cos/sin[tokens, head_dim]`."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Causal GQA attention of new queries over a sequence's keys, batch-invariant (see module NOTE).

    q: `[n, heads, head_dim]`, already rotated; keys/values: `[tokens, kv_heads, head_dim]` for token
    positions 0..tokens-1 (cached prefix then the new tokens); positions: `[n]` absolute positions of the
    queries. A query at position p sees keys 0..p. Returns `[n, heads * head_dim]`.
    """
    n, num_heads, head_dim = q.shape
    num_tokens, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    num_tiles = -(-num_tokens // KEY_TILE_TOKENS)
    key_tiles = pad_rows(keys, KEY_TILE_TOKENS).view(num_tiles, KEY_TILE_TOKENS, num_kv_heads, head_dim)
    value_tiles = pad_rows(values, KEY_TILE_TOKENS).view(num_tiles, KEY_TILE_TOKENS, num_kv_heads, head_dim)
    ones = value_tiles.new_ones((num_tiles, KEY_TILE_TOKENS, num_kv_heads, 1))
    key_tiles = key_tiles.permute(2, 0, 3, 1)  # [kv_heads, tiles, head_dim, tile]
    value_tiles = torch.cat([value_tiles, ones], dim=-1).permute(2, 0, 1, 3)  # [kv_heads, tiles, tile, d+1]
    # Rows ordered (query, group member) inside each kv head, so a chunk of rows is a run of queries;
    # q is scaled first (exact per element, the same for every path).
    rows = (q * head_dim**-0.5).view(n, num_kv_heads, group, head_dim).permute(1, 0, 2, 3)
    rows = rows.reshape(num_kv_heads, n * group, head_dim)
    row_positions = positions.repeat_interleave(group)
    key_index = torch.arange(num_tiles * KEY_TILE_TOKENS, device=q.device).view(num_tiles, KEY_TILE_TOKENS)
    outputs = []
    for start in range(0, n * group, QUERY_CHUNK_ROWS):
        chunk = rows[:, start : start + QUERY_CHUNK_ROWS].transpose(0, 1)
        chunk_positions = row_positions[start : start + QUERY_CHUNK_ROWS]
        # Tiles wholly after the chunk's last query are all masked: they would add exact zeros, so skip them.
        tiles = int(chunk_positions.max()) // KEY_TILE_TOKENS + 1
        masked = key_index[None, :tiles, :] > chunk_positions[:, None, None]  # [m, tiles, tile]
        out = _attend_rows(
            pad_rows(chunk).transpose(0, 1), key_tiles[:, :tiles], value_tiles[:, :tiles], pad_rows(masked)
        )
        outputs.append(out[:, : chunk.shape[0]])
    out = torch.cat(outputs, dim=1).view(num_kv_heads, n, group, head_dim)
    return out.permute(1, 0, 2, 3).reshape(n, num_heads * head_dim)


def _attend_rows(
    rows: torch.Tensor, key_tiles: torch.Tensor, value_tiles: torch.Tensor, masked: torch.Tensor
) -> torch.Tensor:
    """rows `[kv_heads, m, d]`, masked `[m, tiles, tile]` -> `[kv_heads, m, d]` (m a multiple of 8)."""
    scores = torch.matmul(rows[:, None], key_tiles)  # [kv_heads, tiles, m, tile], one GEMM shape per tile
    scores = scores.masked_fill(masked.transpose(0, 1)[None], float("-inf"))
    row_max = scores.amax(dim=(1, 3), keepdim=True)  # max is exact in any order
    weighted = torch.matmul(torch.exp(scores - row_max), value_tiles)  # [kv_heads, tiles, m, d+1]
    total = weighted[:, 0]
    for tile in range(1, weighted.shape[1]):
        total = total + weighted[:, tile]  # in key order: masked tiles add exact zeros
    return total[..., :-1] / total[..., -1:]
