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
    attention  keys in fixed tiles of KEY_TILE_TOKENS; each tile is one GEMM of a fixed shape and one
               softmax-denominator sum over a fixed-length row; tiles are summed one after another in
               key order, so masked (future or padding) keys add exact zeros. A plain softmax would
               instead reduce over a row whose length, and so grouping, depends on the context

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


def tiled_kv(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate KV rows (`[tokens, row]` each) into one buffer padded with zero rows to whole tiles.

    One copy serves both the concatenation and the padding; the zero rows keep masked products exact
    (0 x finite = 0), which uninitialised memory would not.
    """
    num_tokens = sum(part.shape[0] for part in parts)
    num_rows = -(-num_tokens // KEY_TILE_TOKENS) * KEY_TILE_TOKENS
    out = torch.empty((num_rows, parts[-1].shape[1]), dtype=parts[-1].dtype, device=parts[-1].device)
    offset = 0
    for part in parts:
        out[offset : offset + part.shape[0]] = part
        offset += part.shape[0]
    out[offset:] = 0
    return out


def attend(q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention of new queries over a sequence's KV, batch-invariant (see module NOTE).

    q: `[n, heads, head_dim]`, already rotated; kv: `tiled_kv` rows `[K(kv_heads x head_dim) | V(...)]`
    of positions 0.. (cached prefix, then the new tokens, then zero padding); positions: `[n]` absolute
    positions of the queries. A query at position p sees keys 0..p. Returns `[n, heads * head_dim]`.
    """
    n, num_heads, head_dim = q.shape
    num_kv_heads = kv.shape[1] // (2 * head_dim)
    group = num_heads // num_kv_heads
    # [tiles, tile, K|V, kv_heads, head_dim]: per head, K and V tiles are strided views (no copy).
    kv_tiles = kv.view(-1, KEY_TILE_TOKENS, 2, num_kv_heads, head_dim)
    # Rows ordered (query, group member) inside each kv head, so a chunk of rows is a run of queries;
    # q is scaled first (exact per element, the same for every path).
    rows = (q * head_dim**-0.5).view(n, num_kv_heads, group, head_dim).permute(1, 0, 2, 3)
    rows = rows.reshape(num_kv_heads, n * group, head_dim)
    row_positions = positions.repeat_interleave(group)
    outputs = []
    for start in range(0, n * group, QUERY_CHUNK_ROWS):
        chunk_positions = row_positions[start : start + QUERY_CHUNK_ROWS]
        first_pos, last_pos = int(chunk_positions.min()), int(chunk_positions.max())
        # Tiles wholly after the chunk's last query are all masked: they would add exact zeros, so skip
        # them; tiles wholly before its first query need no mask.
        tiles = last_pos // KEY_TILE_TOKENS + 1
        first_masked_tile = first_pos // KEY_TILE_TOKENS
        key_index = torch.arange(
            first_masked_tile * KEY_TILE_TOKENS, tiles * KEY_TILE_TOKENS, device=q.device
        )
        masked = key_index.view(-1, KEY_TILE_TOKENS)[:, None, :] > pad_rows(chunk_positions)[None, :, None]
        chunk = pad_rows(rows[:, start : start + QUERY_CHUNK_ROWS].transpose(0, 1)).transpose(0, 1)
        heads = _attend_rows(chunk, kv_tiles[:tiles, :, 0], kv_tiles[:tiles, :, 1], masked, first_masked_tile)
        outputs.append(heads[:, : chunk_positions.shape[0]])
    out = torch.cat(outputs, dim=1).view(num_kv_heads, n, group, head_dim)
    return out.permute(1, 0, 2, 3).reshape(n, num_heads * head_dim)


def _attend_rows(
    rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, masked: torch.Tensor, first_masked_tile: int
) -> torch.Tensor:
    """Every kv head at once. rows `[heads, m, d]` (m a multiple of 8); keys/values `[tiles, tile, heads, d]`;
    masked `[tiles - first_masked_tile, m, tile]` -> `[heads, m, d]`. Each (head, tile) is one GEMM of the
    same shape, and the ops between them act element by element or along a row of one tile, so a head's
    bits do not depend on the others (the same bits as attending head by head)."""
    keys, values = keys.permute(2, 0, 1, 3), values.permute(2, 0, 1, 3)  # [heads, tiles, tile, d]
    scores = torch.matmul(rows[:, None], keys.transpose(2, 3))  # [heads, tiles, m, tile]
    scores[:, first_masked_tile:].masked_fill_(masked, float("-inf"))
    row_max = scores.amax(dim=(1, 3), keepdim=True)  # max is exact in any order
    weights = scores.sub_(row_max).exp_()
    numerators = torch.matmul(weights, values)  # [heads, tiles, m, d]
    denominators = weights.sum(dim=-1, keepdim=True)  # [heads, tiles, m, 1]: fixed-length rows, fixed order
    numerator, denominator = numerators[:, 0], denominators[:, 0]
    for tile in range(1, numerators.shape[1]):  # in key order: masked tiles add exact zeros
        numerator = numerator + numerators[:, tile]
        denominator = denominator + denominators[:, tile]
    return numerator / denominator
