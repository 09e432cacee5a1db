"""The prefill engine (PE) of a node process: hit KV in, layerwise forward, KV out to the DE buffer.

NOTE: the two read paths (paper §4.1, Fig. 4), as this engine moves bytes:

    PE read (a):  storage ─SNIC─► PE DRAM ─per layer: PE CNIC loopback─► "HBM" tensor ─compute─►
                  hit+miss KV of the layer ─PE CNIC─► DE DRAM buffer
    DE read (b):  storage ─DE SNIC─► DE DRAM ─per layer: DE CNIC─► PE DRAM ─► "HBM" tensor ─compute─►
                  ONLY miss KV of the layer ─PE CNIC─► DE DRAM buffer (merged beside the hit rows)

The order of loads, computes and sends comes from the core's `LayerwisePipeline` (load i+1 overlaps
compute i; modes without layerwise load every layer before computing). Loads run on an I/O thread, sends
on a transmit thread, compute on the worker thread.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from dualpath.engine.pipeline import LayerOp, LayerwisePipeline
from dualpath.kvcache import BlockKey, block_keys
from dualpath.runtime.control import Message
from dualpath.runtime.dram import Region
from dualpath.runtime.kvio import region_layer, scatter_hits, submit_hit_read, usable_hit_tokens
from dualpath.runtime.model.kv_layout import layer_kv_to_bytes
from dualpath.runtime.node import NodeLinks
from dualpath.transfer import ReadResult
from dualpath.transfer.types import Notice

_ALLOC_RETRY_S = 0.005  # a full DRAM buffer is backpressure: retry after one report interval


@dataclass
class PrefillJob:
    rid: int
    token_ids: list[int]
    pe_read: bool
    hit_tokens: int  # planned; becomes the usable hit once the read (or the DE) says so
    de: str
    keys: list[BlockKey]
    region: Region | None = None  # PE DRAM: hit KV read here (a), or pushed here by the DE (b)
    read_done: bool = False
    de_offset: int | None = None
    de_layer_bytes: int = 0
    layer_arrived: list[threading.Event] = field(default_factory=list)
    queued: bool = False  # handed to the worker (ready: hit KV in a DRAM buffer, DE region known)
    first_layer: torch.Tensor | None = None  # layer 0 loaded during the previous forward (prefetch)
    times: dict[str, float] = field(default_factory=dict)  # wall-clock milestones, for per-request records


class PrefillEngine:
    def __init__(self, links: NodeLinks) -> None:
        self.links = links
        self.model = links.model
        self.layers = self.model.config.num_layers
        self.layerwise = links.mode.layerwise
        self.jobs: dict[int, PrefillJob] = {}
        self._early: dict[int, list[Notice]] = {}
        self._lock = threading.Lock()
        self._ready: queue.Queue[PrefillJob | None] = queue.Queue()
        self._io = ThreadPoolExecutor(1, thread_name_prefix="pe-load")
        self._tx = ThreadPoolExecutor(1, thread_name_prefix="pe-send")
        self._worker = threading.Thread(target=self._work, name="pe-worker", daemon=True)
        self._worker.start()

    # ---- control ------------------------------------------------------------------------------
    def on_command(self, message: Message) -> None:
        if message["type"] != "prefill":
            return
        ids = list(message["token_ids"])
        bt = self.links.block_tokens
        hit = int(message["hit_tokens"])
        job = PrefillJob(
            rid=int(message["rid"]),
            token_ids=ids,
            pe_read=int(message["de_read_tokens"]) == 0,
            hit_tokens=hit,
            de=message["de"],
            keys=block_keys(ids[:hit], bt),
            layer_arrived=[threading.Event() for _ in range(self.layers)],
        )
        job.times["pe_assigned"] = time.time()
        with self._lock:
            self.jobs[job.rid] = job
            early = self._early.pop(job.rid, [])
        if job.pe_read and hit > 0:
            self._start_read(job)
        else:
            job.read_done = True
        for notice in early:
            self.on_notice(notice)

    def _start_read(self, job: PrefillJob) -> None:
        region, staging = self._alloc(job.hit_tokens), self._alloc(job.hit_tokens)
        if region is None or staging is None:  # backpressure: the PE buffer is full, try again shortly
            for r in (region, staging):
                if r is not None:
                    self.links.dram.free(r)
            threading.Timer(_ALLOC_RETRY_S, self._start_read, args=(job,)).start()
            return
        job.region = region
        future = submit_hit_read(self.links, f"pe{job.rid}", job.keys, region, staging)
        future.add_done_callback(lambda f: self._on_read(job, staging, f.result()))

    def _on_read(self, job: PrefillJob, staging: Region, result: ReadResult) -> None:
        assert job.region is not None
        self.links.count_corrupt(len(set(result.corrupt_keys)))
        job.hit_tokens = usable_hit_tokens(result, job.keys, self.links.block_tokens)
        scatter_hits(self.links, staging, job.region, job.hit_tokens)
        self.links.dram.free(staging)
        job.times["read_end"] = time.time()
        job.read_done = True
        self._maybe_ready(job)

    def on_notice(self, notice: Notice) -> None:
        payload = notice.payload
        rid = int(payload["rid"])
        with self._lock:
            job = self.jobs.get(rid)
            if job is None:
                self._early.setdefault(rid, []).append(notice)
                return
        if payload["kind"] == "de_ready":
            job.times["de_ready"] = time.time()
            job.de_offset = int(payload["offset"])
            job.de_layer_bytes = int(payload["layer_bytes"])
            if not job.pe_read:
                job.hit_tokens = int(payload["hit_tokens"])
            self._maybe_ready(job)
        elif payload["kind"] == "hit_layer":
            job.layer_arrived[int(payload["layer"])].set()

    def _maybe_ready(self, job: PrefillJob) -> None:
        with self._lock:
            if not (job.read_done and job.de_offset is not None and not job.queued):
                return
            job.queued = True
        if not job.pe_read and job.hit_tokens > 0:
            # DE read path: ask for the hit layers now, so they stream in while earlier forwards compute.
            job.region = self._alloc(job.hit_tokens)
            if job.region is not None:
                self._pull(job)
        self._ready.put(job)

    def load(self) -> dict[str, Any]:
        with self._lock:
            jobs = list(self.jobs.values())
        return {
            "seq": len(jobs),
            "tok": sum(len(j.token_ids) for j in jobs),
            "read_q_tokens": self.links.snic.read_queue.queued_tokens,
            "free_hbm_tokens": 0,
            "known": [j.rid for j in jobs],
        }

    def close(self) -> None:
        self._ready.put(None)
        self._io.shutdown(wait=False, cancel_futures=True)
        self._tx.shutdown(wait=False, cancel_futures=True)

    # ---- the forward ----------------------------------------------------------------------------
    def _work(self) -> None:
        while (job := self._ready.get()) is not None:
            job.times["prefill_start"] = time.time()
            first = self._prefill(job)
            job.times["prefill_end"] = time.time()
            # The first token goes to the client before the DE can produce the second one.
            self.links.send({"type": "tokens", "items": [[job.rid, [first]]]})
            notice = {"kind": "prefilled", "rid": job.rid, "first_token": first, "hit_tokens": job.hit_tokens}
            # Behind this forward's last KV sends on the FIFO transmit thread; the next forward starts now.
            self._tx.submit(self.links.raw.notify, job.de, {**notice, "times": job.times})
            with self._lock:
                del self.jobs[job.rid]
            if job.region is not None:
                self.links.dram.free(job.region)

    def _prefill(self, job: PrefillJob) -> int:
        hit, device = job.hit_tokens, self.model.config.device
        if not job.pe_read and hit > 0 and job.region is None:
            self._request_hit_layers(job)
        hidden = self.model.embed(job.token_ids[hit:])
        positions = torch.arange(hit, len(job.token_ids), device=device)
        loaded: dict[int, torch.Tensor | None] = {}
        outgoing: dict[int, torch.Tensor] = {}

        def compute(layer: int) -> None:
            nonlocal hidden
            cached = loaded.pop(layer)
            hidden, new_kv = self.model.prefill_layer(layer, hidden, positions, cached)
            # PE read path ships hit + miss rows; DE read path only the miss rows (the DE has the hits).
            outgoing[layer] = torch.cat([cached, new_kv]) if job.pe_read and cached is not None else new_kv

        def load(layer: int) -> None:
            loaded[layer] = (
                job.first_layer
                if layer == 0 and job.first_layer is not None
                else self._load_layer(job, layer)
            )
            if layer == self.layers - 1 and self.layerwise:
                self._prefetch_next()  # on the I/O thread, after this forward's last load

        def send(layer: int) -> None:
            self._send_layer(job, layer, outgoing.pop(layer))

        run_pipeline(
            self.layers, self.layerwise, load=load, compute=compute, send=send, io=self._io, tx=self._tx
        )
        return int(self.model.final(hidden[-1:]).argmax(dim=-1)[0])

    def _prefetch_next(self) -> None:
        """Load layer 0 of the next ready forward while this one computes (the layerwise overlap, §4.1,
        carried across forwards), so a forward never starts with an idle GPU waiting for its first layer."""
        with self._ready.mutex:
            upcoming = self._ready.queue[0] if self._ready.queue else None
        if (
            upcoming is not None
            and upcoming.first_layer is None
            and upcoming.hit_tokens > 0
            and upcoming.region
        ):
            upcoming.first_layer = self._load_layer(upcoming, 0)

    def _request_hit_layers(self, job: PrefillJob) -> None:
        """DE read path: a receive region in PE DRAM, then ask the DE to push its hit layers in order."""
        while (region := self._alloc(job.hit_tokens)) is None:
            threading.Event().wait(_ALLOC_RETRY_S)
        job.region = region
        self._pull(job)

    def _pull(self, job: PrefillJob) -> None:
        assert job.region is not None
        notice = {
            "kind": "pull",
            "rid": job.rid,
            "offset": job.region.offset_bytes,
            "layer_bytes": job.region.layer_bytes,
        }
        self.links.raw.notify(job.de, notice)

    def _alloc(self, tokens: int) -> Region | None:
        return self.links.dram.allocate(
            num_layers=self.layers, tokens=tokens, bytes_per_token_per_layer=self.links.row_bytes
        )

    def _load_layer(self, job: PrefillJob, layer: int) -> torch.Tensor | None:
        if job.hit_tokens == 0 or job.region is None:
            return None
        nbytes = job.hit_tokens * self.links.row_bytes
        if job.pe_read:
            self.links.cnic.rx.transmit(nbytes)  # PE DRAM -> PE CNIC (RDMA loopback) -> HBM, paper §5
        else:
            job.layer_arrived[layer].wait()  # the DE's write through DE CNIC => PE CNIC has landed
        return region_layer(self.links, job.region, layer, job.hit_tokens, device=self.model.config.device)

    def _send_layer(self, job: PrefillJob, layer: int, kv: torch.Tensor) -> None:
        assert job.de_offset is not None
        skip = 0 if job.pe_read else job.hit_tokens * self.links.row_bytes
        offset = job.de_offset + layer * job.de_layer_bytes + skip
        notice = {"kind": "kv_layer", "rid": job.rid, "layer": layer}
        self.links.link.write(job.de, "dram", offset, layer_kv_to_bytes(kv), notice)


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
