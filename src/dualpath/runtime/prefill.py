"""The layerwise forward's threads: `run_pipeline` drives the core's `LayerwisePipeline` (paper §4.1).

The prefill node (`runtime/pe_executor.py`) runs each `step` through it: loads on an I/O thread, sends on
a transmit thread, computes on the worker thread; load i+1 overlaps compute i, and modes without
layerwise load every layer before computing.
"""

from __future__ import annotations

import queue
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dualpath.engine.pipeline import LayerOp, LayerwisePipeline


def run_pipeline(
    layers: int,
    layerwise: bool,
    *,
    load: Callable[[int], None],
    compute: Callable[[int], None],
    send: Callable[[int], None],
    io: ThreadPoolExecutor,
    tx: ThreadPoolExecutor,
) -> None:
    """Drive the core's `LayerwisePipeline` with real threads; without layerwise, load all layers first.

    Loads run on `io`, sends on `tx`, computes on the calling thread; completions come back through one
    queue so the pipeline state machine is only ever touched here. It returns once every layer has been
    computed: the remaining sends stay queued on the FIFO `tx` thread (anything queued after them, such
    as the "prefilled" notice, goes out after them), so the next forward overlaps this one's last send.
    """
    events: queue.Queue[tuple[str, int, BaseException | None]] = queue.Queue()

    def background(kind: str, fn: Callable[[int], None], layer: int) -> None:
        try:
            fn(layer)
            events.put((kind, layer, None))
        except BaseException as error:  # surfaced on the worker thread, never lost in a pool
            traceback.print_exc()  # a send that fails after the forward returned is at least logged
            events.put((kind, layer, error))

    if not layerwise:  # Basic (paper §7.1): the whole KV into HBM, then the forward, then the transfer
        for layer in range(layers):
            load(layer)
        for layer in range(layers):
            compute(layer)
        for layer in range(layers):
            tx.submit(background, "sent", send, layer)
        return
    pipe = LayerwisePipeline(layers)

    def issue(ops: list[LayerOp]) -> None:
        for op in ops:
            if op.kind == "load":
                io.submit(background, "loaded", load, op.layer)
            elif op.kind == "send":
                tx.submit(background, "sent", send, op.layer)
            else:
                events.put(("compute", op.layer, None))

    issue(pipe.start())
    computed = 0
    while computed < layers:  # the last sends finish on `tx` while the next forward starts
        kind, layer, error = events.get()
        if error is not None:
            raise error
        if kind == "loaded":
            issue(pipe.on_loaded(layer))
        elif kind == "compute":
            compute(layer)
            computed += 1
            issue(pipe.on_computed(layer))
        else:
            issue(pipe.on_sent(layer))
