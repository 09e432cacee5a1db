"""The PE forward's own Python work beyond its model layers, timed on the runtime's forward path.

`runtime/pe_executor.py` `_step` runs a forward as: embed each item's new tokens, `runtime.prefill.run_pipeline`
(the core's `LayerwisePipeline` with loads on an I/O thread, sends on a transmit thread, computes on the
calling thread; Basic loads everything first), per layer and item `torch.arange` positions + `prefill_layer`,
per layer and item the new rows turned into bytes (`layer_kv_to_bytes`, on the transmit thread), then the
LM head on the last row of each item. This module runs exactly that with tiny new-token counts and no
cached rows (the link writes and the hit reads are not here: the twin prices them as link and store time).
It times the process CPU of the whole forward (every thread: worker, I/O, transmit) and the thread CPU
spent inside `prefill_layer` and in the head (`embed` + `final`, priced by `prefill_head_s`). The
difference is what the cost model's layer and head terms do not cover: pipeline thread hops, per-layer
per-item Python, the byte views (docs/twin.md "What the twin adds").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

Tick = Callable[[str], None]

# Items per forward: one request alone, and a small batch (the runtime's forwards hold 1 to a few items).
ITEM_COUNTS = (1, 4)
_NEW_TOKENS = 16  # one Full Block of new tokens per item: tiny, so layer compute is a small share


def _forward(model: Any, ids: Sequence[list[int]], layerwise: bool, io: ThreadPoolExecutor,
             tx: ThreadPoolExecutor) -> tuple[float, float]:  # fmt: skip
    """One forward as `PrefillExecutor._step` runs it: (process CPU s, CPU s inside layers and head)."""
    from dualpath.runtime.model.kv_layout import layer_kv_to_bytes
    from dualpath.runtime.prefill import run_pipeline

    layers = model.config.num_layers
    inside = [0.0]
    process0 = time.process_time()
    t = time.thread_time()
    hidden = [model.embed(i) for i in ids]
    inside[0] += time.thread_time() - t
    out: list[dict[int, torch.Tensor]] = [{} for _ in ids]

    def load(layer: int) -> None:
        return None  # no cached rows: what a read brings is priced as link and store time

    def compute(layer: int) -> None:
        for k, item_ids in enumerate(ids):
            positions = torch.arange(0, len(item_ids))
            start = time.thread_time()
            hidden[k], new_kv = model.prefill_layer(layer, hidden[k], positions, None)
            inside[0] += time.thread_time() - start
            out[k][layer] = new_kv

    def send(layer: int) -> None:
        for k in range(len(ids)):
            bytes(layer_kv_to_bytes(out[k].pop(layer)))[:0]  # the view the link write takes

    run_pipeline(layers, layerwise, load=load, compute=compute, send=send, io=io, tx=tx)
    tx.submit(lambda: None).result()  # the last sends belong to this forward's CPU
    t = time.thread_time()
    for h in hidden:
        int(model.final(h[-1:]).argmax(-1)[0])
    inside[0] += time.thread_time() - t
    return time.process_time() - process0, inside[0]


def measure_forward_python(model: Any, repeats: int, tick: Tick) -> dict[str, list[float]]:
    """Per (layerwise, items): median over repeats of process CPU minus layer and head CPU, seconds."""
    generator = torch.Generator().manual_seed(7)
    out: dict[str, list[float]] = {"layerwise": [], "items": [], "python_s": [], "forward_cpu_s": []}
    with ThreadPoolExecutor(1) as io, ThreadPoolExecutor(1) as tx:
        for layerwise in (True, False):
            for items in ITEM_COUNTS:
                tick(f"forward python {'layerwise' if layerwise else 'whole'} x{items}")
                ids = [
                    [
                        int(t)
                        for t in torch.randint(model.config.vocab_size, (_NEW_TOKENS,), generator=generator)
                    ]
                    for _ in range(items)
                ]
                _forward(model, ids, layerwise, io, tx)  # warm-up
                samples = [_forward(model, ids, layerwise, io, tx) for _ in range(repeats)]
                out["layerwise"].append(float(layerwise))
                out["items"].append(float(items))
                out["python_s"].append(statistics.median(max(0.0, p - i) for p, i in samples))
                out["forward_cpu_s"].append(statistics.median(p for p, _ in samples))
    return out


def forward_python_terms(m: dict[str, Sequence[float]]) -> dict[str, float]:
    """(fixed per forward, per item) of the Python work, layerwise and whole-KV forwards pooled by item count.

    Two item counts give the line: per item = slope, fixed = the 1-item value less one item.
    """
    by_items: dict[float, list[float]] = {}
    for items, python_s in zip(m["items"], m["python_s"], strict=True):
        by_items.setdefault(float(items), []).append(float(python_s))
    med = {n: statistics.median(v) for n, v in by_items.items()}
    lo, hi = min(med), max(med)
    per_item = max(0.0, (med[hi] - med[lo]) / (hi - lo)) if hi > lo else 0.0
    return {"prefill_python_s": max(0.0, med[lo] - per_item * lo), "prefill_python_s_per_item": per_item}
