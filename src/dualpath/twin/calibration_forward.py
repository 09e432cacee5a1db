"""The PE forward's own Python work beyond its model layers, timed on the runtime's forward path.

Runs what `runtime/pe_executor.py` `_step` runs (embed, `runtime.prefill.run_pipeline` with its I/O and
transmit threads, per layer and item `arange` + `prefill_layer` and `layer_kv_to_bytes`, the LM head)
with tiny new-token counts, without and with `CACHED_TOKENS` cached rows per item (copied out of a DRAM
buffer as the I/O thread does). Process CPU of the forward minus the thread CPU inside `prefill_layer`
and the head is what the cost model's terms do not cover (docs/twin.md "What the twin adds").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from dualpath.twin.calibration import Tick

# Items per forward: one request alone, and a small batch (the runtime's forwards hold 1 to a few items).
ITEM_COUNTS = (1, 4)
# Cached rows per item: none, and a typical hit of the scaled 64K trace (a few hundred tokens).
CACHED_TOKENS = (0, 512)
_NEW_TOKENS = 16  # one Full Block of new tokens per item: tiny, so layer compute is a small share


def _forward(model: Any, ids: Sequence[list[int]], cached: int, layerwise: bool, io: ThreadPoolExecutor,
             tx: ThreadPoolExecutor) -> tuple[float, float]:  # fmt: skip
    """One forward as `PrefillExecutor._step` runs it: (process CPU s, CPU s inside layers and head)."""
    import numpy as np

    from dualpath.runtime.model.kv_layout import layer_kv_from_buffer, layer_kv_to_bytes
    from dualpath.runtime.prefill import run_pipeline

    config = model.config
    layers = config.num_layers
    layer_bytes = cached * config.kv_row_elems * torch.tensor([], dtype=config.torch_dtype).element_size()
    dram = np.zeros(max(1, layers * layer_bytes), dtype=np.uint8)  # one item's landing region
    inside = [0.0]
    process0 = time.process_time()
    t = time.thread_time()
    hidden = [model.embed(i) for i in ids]
    inside[0] += time.thread_time() - t
    loaded: list[dict[int, torch.Tensor | None]] = [{} for _ in ids]
    out: list[dict[int, torch.Tensor]] = [{} for _ in ids]

    def load(layer: int) -> None:
        for k in range(len(ids)):
            loaded[k][layer] = (
                layer_kv_from_buffer(dram, cached, config, offset_bytes=layer * layer_bytes).to(
                    "cpu", copy=True
                )
                if cached
                else None
            )

    def compute(layer: int) -> None:
        for k, item_ids in enumerate(ids):
            positions = torch.arange(cached, cached + len(item_ids))
            rows = loaded[k].pop(layer)
            start = time.thread_time()
            hidden[k], new_kv = model.prefill_layer(layer, hidden[k], positions, rows)
            inside[0] += time.thread_time() - start
            out[k][layer] = new_kv
            if rows is not None:
                out[k][-1 - layer] = rows  # the hit rows go to the DE too (first chunk)

    def send(layer: int) -> None:
        for k in range(len(ids)):
            if cached:
                bytes(layer_kv_to_bytes(out[k].pop(-1 - layer)))[:0]
            bytes(layer_kv_to_bytes(out[k].pop(layer)))[:0]  # the view the link write takes

    run_pipeline(layers, layerwise, load=load, compute=compute, send=send, io=io, tx=tx)
    tx.submit(lambda: None).result()  # the last sends belong to this forward's CPU
    t = time.thread_time()
    for h in hidden:
        int(model.final(h[-1:]).argmax(-1)[0])
    inside[0] += time.thread_time() - t
    return time.process_time() - process0, inside[0]


def measure_forward_python(model: Any, repeats: int, tick: Tick) -> dict[str, list[float]]:
    """Per (layerwise, items, cached): median over repeats of process CPU minus layer and head CPU, seconds."""
    generator = torch.Generator().manual_seed(7)
    out: dict[str, list[float]] = {"layerwise": [], "items": [], "cached_tokens": [], "python_s": [],
                                   "forward_cpu_s": []}  # fmt: skip
    with ThreadPoolExecutor(1) as io, ThreadPoolExecutor(1) as tx:
        for layerwise in (True, False):
            for items in ITEM_COUNTS:
                for cached in CACHED_TOKENS:
                    tick(f"forward python {'layerwise' if layerwise else 'whole'} x{items} +{cached}")
                    shape = (items, _NEW_TOKENS)
                    ids = torch.randint(model.config.vocab_size, shape, generator=generator).tolist()
                    _forward(model, ids, cached, layerwise, io, tx)  # warm-up
                    samples = [_forward(model, ids, cached, layerwise, io, tx) for _ in range(repeats)]
                    out["layerwise"].append(float(layerwise))
                    out["items"].append(float(items))
                    out["cached_tokens"].append(float(cached))
                    out["python_s"].append(statistics.median(max(0.0, p - i) for p, i in samples))
                    out["forward_cpu_s"].append(statistics.median(p for p, _ in samples))
    return out


def forward_python_terms(m: dict[str, Sequence[float]]) -> dict[str, float]:
    """(fixed per forward, per item, per cached token) of the Python work; layerwise and whole-KV pooled.

    From the forwards without cached rows, two item counts give the line: per item = slope, fixed = the
    1-item value less one item. Per cached token = the median over item counts of (with − without) ÷ the
    forward's cached tokens. (Measurements older than the cached rows have none: 0.)
    """
    cached = m.get("cached_tokens", [0.0] * len(m["items"]))
    by_key: dict[tuple[float, float], list[float]] = {}
    for items, c, python_s in zip(m["items"], cached, m["python_s"], strict=True):
        by_key.setdefault((float(items), float(c)), []).append(float(python_s))
    med = {key: statistics.median(v) for key, v in by_key.items()}
    bare = {items: t for (items, c), t in med.items() if c == 0.0}
    lo, hi = min(bare), max(bare)
    per_item = max(0.0, (bare[hi] - bare[lo]) / (hi - lo)) if hi > lo else 0.0
    per_token = [
        (t - bare[items]) / (items * c) for (items, c), t in med.items() if c > 0.0 and items in bare
    ]
    return {
        "prefill_python_s": max(0.0, bare[lo] - per_item * lo),
        "prefill_python_s_per_item": per_item,
        "prefill_python_s_per_cached_token": max(0.0, statistics.median(per_token)) if per_token else 0.0,
    }
