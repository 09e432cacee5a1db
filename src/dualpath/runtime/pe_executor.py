"""The prefill node as an executor of the core's commands (`read`, `step`), paper §4.1 Fig. 4.

NOTE: the scheduler's `RuntimeDriver` decides every read, batch and chunk (`ClusterCore`); this node only
moves bytes and computes, then reports back. One `step` message = ONE forward over all its items,
layer-major (for each layer, each item's compute), driven by the core's `LayerwisePipeline`:

    rows of an item's cached prefix, per layer:
      [0, pe_rows)        PE DRAM (its PE-side read) ─PE CNIC loopback─► "HBM"     (load_pe_tokens)
      [pe_rows, valid)    DE DRAM (DE-side read, earlier chunks) ─DE CNIC ⇒ PE CNIC─► PE DRAM ─► "HBM"
    compute tokens [valid, cached + new); out ─PE CNIC─► the DE's landing region: the new rows, plus on
    the first chunk the PE-side hit rows (the DE does not have them)

A corrupt block found by a read shrinks the request's hit in the core (`ClusterCore.on_read_done`): the
step items then say the smaller `hit_tokens`, and the first chunk computes the lost rows.
`step_done` goes to the scheduler when the last layer is computed (GPU free); `kv_out_done` once every
send of the step left, behind them on the FIFO transmit thread (with a `kv_done` notice to each DE).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from dualpath.kvcache import block_keys
from dualpath.runtime.control import Message
from dualpath.runtime.dram import Region
from dualpath.runtime.kvio import region_layer, scatter_hits, submit_hit_read, usable_hit_tokens
from dualpath.runtime.model.kv_layout import layer_kv_to_bytes
from dualpath.runtime.node_links import NodeLinks
from dualpath.runtime.os_thread import EngineWork, name_os_thread
from dualpath.runtime.prefill import run_pipeline
from dualpath.runtime.sampling import SamplingParams, finish_reason, sample_next
from dualpath.transfer.types import Notice


@dataclass
class _PeRequest:
    rid: int
    region: Region | None = None  # PE-side hit rows [0, pe_rows)
    pe_rows: int = 0
    landing: tuple[int, int] | None = None  # (offset, layer_bytes) of its DE landing region
    landing_set: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Item:
    """One request's share of this forward, resolved against what the reads actually brought."""

    body: dict[str, Any]
    state: _PeRequest
    valid: int  # cached rows usable as they are
    pe_rows: int  # of them, from the PE region
    end: int  # cached + new
    first: bool
    recv: Region | None = None  # PE DRAM receive region for the DE-side rows of this step
    arrived: list[threading.Event] = field(default_factory=list)
    hidden: torch.Tensor | None = None
    loaded: dict[int, torch.Tensor | None] = field(default_factory=dict)
    out: dict[int, torch.Tensor] = field(default_factory=dict)


class PrefillExecutor:
    def __init__(self, links: NodeLinks) -> None:
        self.links = links
        self.model = links.model
        self.layers = self.model.config.num_layers
        self.requests: dict[int, _PeRequest] = {}
        self._items: dict[tuple[int, int], _Item] = {}  # (rid, step) -> item awaiting DE rows
        self._dropped: set[int] = set()  # re-planned elsewhere or cancelled (`drop`): work for them is void
        self._reading: dict[int, int] = {}  # rid -> its reads in flight
        self._lock = threading.Lock()
        self._steps: queue.Queue[Message | None] = queue.Queue()
        self._io = ThreadPoolExecutor(1, thread_name_prefix="pe-load")
        self._tx = ThreadPoolExecutor(1, thread_name_prefix="pe-send")
        self.work = EngineWork()  # the forwards' wall and CPU time on this thread (/metrics)
        self._worker = threading.Thread(target=self._work, name="pe-worker", daemon=True)
        self._worker.start()

    def _state(self, rid: int) -> _PeRequest:
        with self._lock:
            return self.requests.setdefault(rid, _PeRequest(rid))

    # ---- messages ---------------------------------------------------------------------------------
    def on_command(self, message: Message) -> None:
        if message["type"] == "read":
            with self._lock:
                rid = int(message["rid"])
                self._reading[rid] = self._reading.get(rid, 0) + 1
            threading.Thread(target=self._read, args=(message,), daemon=True).start()
        elif message["type"] == "step":
            self._steps.put(message)
        elif message["type"] == "drop":
            self._drop(int(message["rid"]))

    def _drop(self, rid: int) -> None:
        """The scheduler re-planned or cancelled the request (its DE died, or the client left): nothing
        waits for its landing or rows any more, its sends are skipped, and its PE region is freed once
        no read or step uses it."""
        with self._lock:
            self._dropped.add(rid)
            state = self.requests.get(rid)
            items = [item for (r, _), item in self._items.items() if r == rid]
            idle = not items and not self._reading.get(rid)
            if idle:
                self.requests.pop(rid, None)
        if state is not None:
            state.landing_set.set()
        for item in items:
            for event in item.arrived:
                event.set()
        if idle and state is not None and state.region is not None:
            self.links.dram.free(state.region)
            state.region = None

    def _read(self, message: Message, *, report: bool = True) -> None:
        """PE-side read of hit rows [start, start + tokens) (start is 0 on the PE side) into PE DRAM."""
        rid, start, tokens = int(message["rid"]), int(message["start_tokens"]), int(message["tokens"])
        state = self._state(rid)
        bt = self.links.block_tokens
        keys = block_keys(list(message["token_ids"]), bt)[start // bt : (start + tokens) // bt]
        state.region, staging = self.links.allocate_region(start + tokens), self.links.allocate_region(tokens)
        result = submit_hit_read(self.links, f"pe{rid}", keys, state.region, staging).result()
        self.links.count_corrupt(len(set(result.corrupt_keys)))
        usable = usable_hit_tokens(result, keys, bt)
        with self.links.spans.span("pe.scatter", rid=rid, tokens=usable):
            scatter_hits(self.links, staging, state.region, usable, start_tokens=start)
        self.links.dram.free(staging)
        state.pe_rows = start + usable
        with self._lock:
            left = self._reading.pop(rid, 1) - 1
            if left:
                self._reading[rid] = left
            dropped = rid in self._dropped
            if dropped and not left:
                self.requests.pop(rid, None)
        if dropped:
            if state.region is not None and self.requests.get(rid) is None:
                self.links.dram.free(state.region)
                state.region = None
            return
        if report:  # an oracle's inline read was no core command: nothing to report
            self.links.emit({"type": "read_done", "rid": rid, "usable_tokens": usable})

    def on_notice(self, notice: Notice) -> None:
        payload = notice.payload
        rid = int(payload["rid"])
        if payload["kind"] == "landing":
            state = self._state(rid)
            state.landing = (int(payload["offset"]), int(payload["layer_bytes"]))
            state.landing_set.set()
        elif payload["kind"] == "rows":
            with self._lock:
                item = self._items.get((rid, int(payload["step"])))
            if item is not None:
                item.arrived[int(payload["layer"])].set()

    def load(self) -> dict[str, Any]:
        return {"read_q_tokens": self.links.snic.read_queue.queued_tokens}

    def stats(self) -> dict[str, float]:
        return self.work.stats()

    def close(self) -> None:
        self._steps.put(None)
        self._io.shutdown(wait=False, cancel_futures=True)
        self._tx.shutdown(wait=False, cancel_futures=True)

    # ---- the forward --------------------------------------------------------------------------------
    def _work(self) -> None:
        name_os_thread("pe-worker")  # the engine thread, as calibration and profilers see it
        spans = self.links.spans
        while (message := self._steps.get()) is not None:
            shapes = [[b["rid"], b["cached_tokens"], b["new_tokens"], b["completes_prefill"]]
                      for b in message["items"]] if spans.on else []  # fmt: skip
            with self.work.timed(), spans.span("pe.forward", step_id=message["step_id"], items=shapes):
                self._step(message)

    def _resolve(self, step: int, body: dict[str, Any]) -> _Item:
        rid = int(body["rid"])
        state = self._state(rid)
        cached, new = int(body["cached_tokens"]), int(body["new_tokens"])
        first = cached == int(body["hit_tokens"])
        if body["inline_io"] and first and cached:  # oracle: the PE reads its whole hit itself (unpaced)
            inline = {
                "rid": rid,
                "start_tokens": 0,
                "tokens": cached,
                "token_ids": body["token_ids"][:cached],
            }
            with self.links.spans.span("pe.inline_read", rid=rid, tokens=cached):
                self._read(inline, report=False)
        valid = cached  # the core's cached prefix: a lost block already shrank the hit
        pe_limit = state.pe_rows if state.region is not None else 0
        pe_rows = min(pe_limit, valid)
        item = _Item(body=body, state=state, valid=valid, pe_rows=pe_rows, end=cached + new, first=first)
        item.arrived = [threading.Event() for _ in range(self.layers)]
        if valid > pe_rows:
            item.recv = self.links.allocate_region(valid - pe_rows)
        with self._lock:
            self._items[(rid, step)] = item
            dropped = rid in self._dropped
        if dropped:  # queued before its drop: computed for nothing, sent nowhere
            state.landing_set.set()
            for event in item.arrived:
                event.set()
            return item
        # The DE answers with its landing region, then pushes rows [pe_rows, valid) layer by layer.
        pull = {"kind": "pull", "rid": rid, "step": step, "start": pe_rows, "end": valid,
                "prompt_tokens": len(body["token_ids"]),
                "offset": item.recv.offset_bytes if item.recv else 0,
                "layer_bytes": item.recv.layer_bytes if item.recv else 0}  # fmt: skip
        with contextlib.suppress(OSError, KeyError, ValueError, zmq.ZMQError):  # a DE that died: dropped soon
            self.links.raw.notify(body["de"], pull)
        return item

    def _step(self, message: Message) -> None:
        step = int(message["step_id"])
        spans = self.links.spans
        items = [self._resolve(step, body) for body in message["items"]]
        device = self.model.config.device
        with spans.span("pe.embed", step_id=step):
            for item in items:
                ids = item.body["token_ids"][item.valid : item.end]
                item.hidden = self.model.embed(ids)

        def load(layer: int) -> None:
            with spans.span("pe.load", step_id=step, layer=layer):
                load_rows(layer)

        computed_s: dict[int, float] = {}  # when each layer's new KV was ready to send

        def load_rows(layer: int) -> None:
            ready_s = time.monotonic()  # every item's rows are in PE DRAM: the loopbacks go back to back
            for item in items:
                parts = []
                if item.pe_rows:
                    self.links.cnic.rx.transmit(item.pe_rows * self.links.row_bytes, ready_s=ready_s)  # §5
                    assert item.state.region is not None
                    parts.append(
                        region_layer(self.links, item.state.region, layer, item.pe_rows, device=device)
                    )
                if item.recv is not None:
                    item.arrived[layer].wait()  # the DE's write through DE CNIC => PE CNIC has landed
                    rows = item.valid - item.pe_rows
                    parts.append(region_layer(self.links, item.recv, layer, rows, device=device))
                item.loaded[layer] = torch.cat(parts) if len(parts) > 1 else (parts[0] if parts else None)

        def compute(layer: int) -> None:
            with spans.span("pe.layer", step_id=step, layer=layer):
                compute_rows(layer)

        def compute_rows(layer: int) -> None:
            for item in items:
                positions = torch.arange(item.valid, item.end, device=device)
                cached = item.loaded.pop(layer)
                assert item.hidden is not None
                item.hidden, new_kv = self.model.prefill_layer(layer, item.hidden, positions, cached)
                item.out[layer] = new_kv
                if item.first and item.pe_rows:  # the PE-side hit rows must reach the DE too
                    assert cached is not None
                    item.out[-1 - layer] = cached[: item.pe_rows]
            computed_s[layer] = time.monotonic()

        def send(layer: int) -> None:
            with spans.span("pe.send", step_id=step, layer=layer):
                send_rows(layer)

        def send_rows(layer: int) -> None:
            ready_s = computed_s[layer]
            for item in items:
                if not item.state.landing_set.is_set():  # its bytes can go once the DE named the landing
                    item.state.landing_set.wait()
                    ready_s = time.monotonic()
                if item.state.landing is None or int(item.body["rid"]) in self._dropped:
                    continue  # dropped: its DE is gone or it was cancelled
                try:
                    self._send_layer(item, layer, ready_s)
                except (OSError, KeyError, ValueError):  # its DE died mid-send: the scheduler re-plans it
                    continue

        run_pipeline(self.layers, message["layerwise"], load=load, compute=compute, send=send,
                     io=self._io, tx=self._tx)  # fmt: skip
        first_tokens, stopped = [], []
        for item in items:
            assert item.hidden is not None
            if item.body["completes_prefill"]:
                with spans.span("pe.head", step_id=step, rid=item.body["rid"]):
                    rid, token, reason = self._first_token(item.body, item.hidden)
                first_tokens.append([rid, token])
                if reason == "stop":
                    stopped.append(rid)
            if item.recv is not None:
                self.links.dram.free(item.recv)
        done: Message = {"type": "step_done", "step_id": step, "first_tokens": first_tokens}
        if stopped:
            done["stopped"] = stopped
        self.links.emit(done)
        self._tx.submit(self._after_sends, step, items)

    def _after_sends(self, step: int, items: list[_Item]) -> None:
        with self.links.spans.span("pe.after_sends", step_id=step):
            self._notify_sent(step, items)

    def _send_layer(self, item: _Item, layer: int, ready_s: float) -> None:
        """One layer of the item's KV to its DE's landing region (and, on a first chunk, its PE-side
        hit rows: the DE does not have them); `ready_s`: when the layer was computed (`PacedBackend`)."""
        assert item.state.landing is not None
        offset, layer_bytes = item.state.landing
        base = offset + layer * layer_bytes
        row = self.links.row_bytes
        if item.first and item.pe_rows:
            hits = item.out.pop(-1 - layer)
            self.links.link.write(item.body["de"], "dram", base, layer_kv_to_bytes(hits), ready_s=ready_s)
        new_kv = item.out.pop(layer)
        self.links.link.write(item.body["de"], "dram", base + item.valid * row, layer_kv_to_bytes(new_kv),
                              ready_s=ready_s)  # fmt: skip

    def _first_token(self, body: dict[str, Any], hidden: torch.Tensor) -> tuple[int, int, str | None]:
        """Token 1, drawn here from the last forward's logits with the request's sampling (the decode node
        draws the rest with the same `sample_next`), and whether it ends the output."""
        params = SamplingParams.from_message(body.get("sampling") or {})
        logits = self.model.final(hidden[-1:])[0]
        token = sample_next(logits, params, (), position=len(body["token_ids"]))
        return int(body["rid"]), token, finish_reason(params, [token], int(body.get("max_tokens", 1)))

    def _notify_sent(self, step: int, items: list[_Item]) -> None:
        """On the FIFO transmit thread, behind the step's last sends: tell each DE, then the scheduler."""
        for item in items:
            rid = int(item.body["rid"])
            done = bool(item.body["completes_prefill"])
            with contextlib.suppress(OSError, KeyError, ValueError, zmq.ZMQError):  # a DE that died
                self.links.raw.notify(item.body["de"], {"kind": "kv_done", "rid": rid, "completes": done})
            with self._lock:
                self._items.pop((rid, step), None)
                dropped = rid in self._dropped and not self._reading.get(rid)
                state = self.requests.pop(rid, None) if done or dropped else None
            if state is not None and state.region is not None:
                self.links.dram.free(state.region)
        self.links.emit({"type": "kv_out_done", "step_id": step})
