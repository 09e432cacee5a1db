"""Byte movement shared by PE and DE: hit reads into a layer-major DRAM region, Layer Block views.

A region holds `tokens` rows of every layer (see `dram.Region`); the hit KV of block b, layer l lands at

    region.layer_offset_bytes(l) + b * block_tokens * row_bytes

so each storage Layer Block (paper §4.1) is read straight to its place and a whole layer of the request is
one contiguous slice — the unit of one layerwise transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from dualpath.kvcache import BlockKey
from dualpath.runtime.dram import Region
from dualpath.runtime.model.kv_layout import layer_kv_from_buffer
from dualpath.transfer import BlockRead, ReadJob, ReadResult

if TYPE_CHECKING:
    from dualpath.runtime.node_links import NodeLinks


def submit_hit_read(
    links: NodeLinks, job_id: str, keys: Sequence[BlockKey], region: Region, staging: Region
) -> Future[ReadResult]:
    """Queue the read of the Full Blocks `keys` on this node's SNIC (FIFO read queue) into `staging`.

    One storage read per Full Block (not per Layer Block): every read is a few Python calls, and on a
    busy host fewer, larger reads keep the emulated SNIC saturated. `scatter_hits` then moves each block's
    Layer Blocks to their layer-major place in `region` (one memcpy, no relayout of a row).
    """
    full_block_bytes = links.block_tokens * links.row_bytes * region.num_layers
    view = links.dram_view
    blocks = tuple(
        BlockRead(key=key, out=view[start : start + full_block_bytes])
        for b, key in enumerate(keys)
        for start in [staging.offset_bytes + b * full_block_bytes]
    )
    links.read_wait.enter()
    future = links.reader.submit(ReadJob(job_id=job_id, blocks=blocks, tokens=len(keys) * links.block_tokens))
    future.add_done_callback(lambda _: links.read_wait.leave())
    return future


def scatter_hits(
    links: NodeLinks, staging: Region, region: Region, hit_tokens: int, *, start_tokens: int = 0
) -> None:
    """Full Blocks `[blocks, layers, bt, row]` in `staging` -> rows `[start, start + hit)` of each layer
    of `region` (a split read brings the tail of the hit: `start_tokens` > 0)."""
    if hit_tokens == 0:
        return
    bt, layers, row = links.block_tokens, region.num_layers, links.row_bytes
    blocks = hit_tokens // bt
    src = torch.frombuffer(
        links.dram_view, dtype=torch.uint8, count=blocks * layers * bt * row, offset=staging.offset_bytes
    )
    src = src.view(blocks, layers, bt * row)
    for layer in range(layers):
        start = region.layer_offset_bytes(layer) + start_tokens * row
        dst = torch.frombuffer(links.dram_view, dtype=torch.uint8, count=hit_tokens * row, offset=start)
        dst.view(blocks, bt * row).copy_(src[:, layer])


def usable_hit_tokens(result: ReadResult, keys: Sequence[BlockKey], block_tokens: int) -> int:
    """Hit tokens up to the first block that was missing or corrupt: the rest become misses (recomputed)."""
    bad = set(result.missing_keys) | set(result.corrupt_keys)
    for index, key in enumerate(keys):
        if key in bad:
            return index * block_tokens
    return len(keys) * block_tokens


def region_layer(links: NodeLinks, region: Region, layer: int, tokens: int, *, device: str) -> torch.Tensor:
    """`tokens` rows of one layer of `region` on `device`: a copy there (the H2D of the data path), or on
    the CPU the DRAM buffer's own rows, no copy (the caller copies them on: into the paged cache, or into
    attention's key tiles). The region must outlive the tensor's use: the engines free it afterwards."""
    view = links.dram_view
    config = links.model.config
    rows = layer_kv_from_buffer(view, tokens, config, offset_bytes=region.layer_offset_bytes(layer))
    return rows.to(device)
