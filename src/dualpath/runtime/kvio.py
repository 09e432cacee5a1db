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
    from dualpath.runtime.node import NodeLinks


def submit_hit_read(
    links: NodeLinks, job_id: str, keys: Sequence[BlockKey], region: Region
) -> Future[ReadResult]:
    """Queue the read of every Layer Block of `keys` into `region` on this node's SNIC (FIFO read queue)."""
    bt, row = links.block_tokens, links.row_bytes
    view = links.dram_view
    block_bytes = bt * row
    blocks = []
    for b, key in enumerate(keys):
        for layer in range(region.num_layers):
            start = region.layer_offset_bytes(layer) + b * block_bytes
            blocks.append(BlockRead(key=key, out=view[start : start + block_bytes], layer=layer))
    links.read_wait.enter()
    future = links.reader.submit(ReadJob(job_id=job_id, blocks=tuple(blocks), tokens=len(keys) * bt))
    future.add_done_callback(lambda _: links.read_wait.leave())
    return future


def usable_hit_tokens(result: ReadResult, keys: Sequence[BlockKey], block_tokens: int) -> int:
    """Hit tokens up to the first block that was missing or corrupt: the rest become misses (recomputed)."""
    bad = set(result.missing_keys) | set(result.corrupt_keys)
    for index, key in enumerate(keys):
        if key in bad:
            return index * block_tokens
    return len(keys) * block_tokens


def region_layer(links: NodeLinks, region: Region, layer: int, tokens: int, *, device: str) -> torch.Tensor:
    """A copy of `tokens` rows of one layer of `region`, on `device` (the H2D of the data path)."""
    view = links.dram_view
    config = links.model.config
    rows = layer_kv_from_buffer(view, tokens, config, offset_bytes=region.layer_offset_bytes(layer))
    return rows.to(device, copy=True)
