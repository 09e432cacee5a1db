"""The decode node as an executor of the core's commands (`read`, `h2d`, `persist`, `decode_step`,
`release`), paper §4.1 Fig. 4.

NOTE: the scheduler's `RuntimeDriver` decides when each of these happens (`ClusterCore`); this node moves
the bytes and computes:

    landing    one layer-major region per request for its whole prompt KV in the DE DRAM buffer, made by
               its DE-side read or by the PE's first `pull` (the core reserved its bytes)
    read       hit rows [start, start + tokens) storage ─DE SNIC─► landing region
    pull       answer `landing` (where the PE writes), push rows [start, end) ─DE CNIC ⇒ PE CNIC─► PE DRAM
    kv_done    the PE's last step of the request has landed: `h2d` may copy the region
    h2d        landing region ─DE CNIC loopback─► the paged KV cache ("HBM")
    persist    whole blocks [start, end) ─SNIC tx─► storage, from the landing region (prompt blocks) or
               from the cache (decode-time blocks, the D2H)
    decode_step a run of `steps` continuous-batching steps of exactly the batch the core says (cut
               short at a step boundary by `decode_cut`); the run's tokens back in one `decode_done`.
               Each token is drawn here (`sample_next`); a request whose token is an EOS or stop token
               (or that `decode_stop` cancelled) leaves the batch at once, reported as `finished`
    release    the request is done (its persists landed): free its cache pages

In `oracle` mode the node's links are unpaced (`node_links`): a `decode_step` joiner's KV goes from its
landing region into the cache without an `h2d` command, and `persist` commands write at once.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from dualpath.kvcache import ROOT_KEY, block_keys
from dualpath.runtime.control import Message
from dualpath.runtime.dram import Region
from dualpath.runtime.kvio import region_layer, scatter_hits, submit_hit_read, usable_hit_tokens
from dualpath.runtime.model.paged_cache import PagedKVCache
from dualpath.runtime.node_links import NodeLinks
from dualpath.runtime.os_thread import EngineWork, name_os_thread
from dualpath.runtime.sampling import SamplingParams, finish_reason, sample_next
from dualpath.transfer import BlockWrite, WriteJob
from dualpath.transfer.types import Notice


@dataclass
class _DeRequest:
    rid: int
    region: Region | None = None  # landing: the whole prompt KV, layer-major
    landed: threading.Event = field(default_factory=threading.Event)
    token_ids: list[int] = field(default_factory=list)  # prompt, then generated tokens with KV
    in_cache: bool = False
    h2d_done: bool = False
    dram_persists: int = 0  # prompt-block persists still reading the landing region
    released: bool = False
    # Set when it joins a decode batch: how it draws and when it stops (`runtime.sampling`).
    prompt_tokens: int = 0
    max_tokens: int = 0
    generated: int = 0
    output: list[int] = field(default_factory=list)  # output tokens so far (token 1 first), one append each
    sampling: SamplingParams = field(default_factory=SamplingParams)
    finish_reason: str | None = None


class DecodeExecutor:
    def __init__(self, links: NodeLinks) -> None:
        self.links = links
        self.model = links.model
        self.layers = self.model.config.num_layers
        bt = links.block_tokens
        # The DE's "HBM": a paged pool of Full-Block pages; the core reserves len_r in it (§6.2).
        self.cache = PagedKVCache(
            self.model.config, num_pages=-(-links.spec.hbm_tokens // bt) + 1, block_tokens=bt
        )
        self.requests: dict[int, _DeRequest] = {}
        self._cut_run = 0  # id of a run the scheduler asked to end at its next step boundary
        self._stopped: set[int] = set()  # requests cancelled (`decode_stop`), read between steps
        self._dropped: set[int] = set()  # re-planned elsewhere or cancelled before decode (`drop`)
        self._reading: dict[int, int] = {}  # rid -> its reads in flight
        # Run restarts: a run that continues requests of the one before waited (previous run's end ->
        # its start) for the completion's trip to the scheduler and the next command back.
        self._last_run: tuple[float, frozenset[int]] = (0.0, frozenset())  # (ended, its batch)
        self.decode_restarts = 0
        self.decode_restart_s = 0.0
        self._lock = threading.Lock()
        self._decode: queue.Queue[Message | None] = queue.Queue()
        self._h2d = ThreadPoolExecutor(1, thread_name_prefix="de-h2d")
        self._persist = ThreadPoolExecutor(1, thread_name_prefix="de-persist")
        self._tx = ThreadPoolExecutor(1, thread_name_prefix="de-send")
        self.work = EngineWork()  # the decode runs' wall and CPU time on this thread (/metrics)
        self._worker = threading.Thread(target=self._decode_loop, name="de-decode", daemon=True)
        self._worker.start()

    def _state(self, rid: int) -> _DeRequest:
        with self._lock:
            return self.requests.setdefault(rid, _DeRequest(rid))

    def _landing(self, state: _DeRequest, prompt_tokens: int) -> Region:
        with self._lock:
            if state.region is None:
                state.region = self.links.allocate_region(prompt_tokens)
            return state.region

    # ---- messages -----------------------------------------------------------------------------------
    def on_command(self, message: Message) -> None:
        kind = message["type"]
        if kind == "read":
            with self._lock:
                rid = int(message["rid"])
                self._reading[rid] = self._reading.get(rid, 0) + 1
            threading.Thread(target=self._read, args=(message,), daemon=True).start()
        elif kind == "drop":
            self._drop(int(message["rid"]))
        elif kind == "h2d":
            self._h2d.submit(self._do_h2d, message)
        elif kind == "persist":
            state = self._state(int(message["rid"]))
            if not message["from_hbm"]:
                with self._lock:
                    state.dram_persists += 1
                    state.token_ids = state.token_ids or list(message["token_ids"])
            self._persist.submit(self._do_persist, message)
        elif kind == "decode_cut":
            self._cut_run = int(message["step"])  # read by the decode thread between steps
        elif kind == "decode_stop":
            with self._lock:
                self._stopped.add(int(message["rid"]))
        elif kind in ("decode_step", "release"):
            self._decode.put(message)  # in step order: a release never frees pages a step still reads

    def _read(self, message: Message) -> None:
        rid, start, tokens = int(message["rid"]), int(message["start_tokens"]), int(message["tokens"])
        state = self._state(rid)
        region = self._landing(state, int(message["prompt_tokens"]))
        bt = self.links.block_tokens
        keys = block_keys(list(message["token_ids"]), bt)[start // bt : (start + tokens) // bt]
        staging = self.links.allocate_region(tokens)
        result = submit_hit_read(self.links, f"de{rid}", keys, region, staging).result()
        self.links.count_corrupt(len(set(result.corrupt_keys)))
        usable = usable_hit_tokens(result, keys, bt)
        with self.links.spans.span("de.scatter", rid=rid, tokens=usable):
            scatter_hits(self.links, staging, region, usable, start_tokens=start)
        self.links.dram.free(staging)
        with self._lock:
            left = self._reading.pop(rid) - 1
            if left:
                self._reading[rid] = left
            dropped = rid in self._dropped and not left
        if dropped:
            self._decode.put({"type": "release", "rid": rid})  # the drop waited for this read
            return
        self.links.emit({"type": "read_done", "rid": rid, "usable_tokens": usable})

    def _drop(self, rid: int) -> None:
        """The scheduler re-planned or cancelled the request before its decode (its PE died, or the
        client left): free its landing region and pages, after any read still writing into them."""
        with self._lock:
            self._dropped.add(rid)
            busy = bool(self._reading.get(rid))
        if not busy:
            self._decode.put({"type": "release", "rid": rid})

    def on_notice(self, notice: Notice) -> None:
        payload = notice.payload
        kind = payload["kind"]
        if int(payload["rid"]) in self._dropped:
            return
        state = self._state(int(payload["rid"]))
        if kind == "pull":
            self._landing(state, int(payload["prompt_tokens"]))
            self._tx.submit(self._push_rows, state, notice.src, payload, time.monotonic())
        elif kind == "kv_done" and payload["completes"]:
            state.landed.set()

    def _push_rows(self, state: _DeRequest, pe: str, payload: dict[str, Any], ready_s: float) -> None:
        """Where the PE writes (landing), then rows [start, end) per layer in order (Fig. 4b, 3-5); the
        rows are in DRAM since the pull (`ready_s`), so the layers go back to back (`PacedBackend`)."""
        region = state.region
        if region is None:  # dropped meanwhile (its PE died)
            return
        self.links.raw.notify(pe, {"kind": "landing", "rid": state.rid, "offset": region.offset_bytes,
                                   "layer_bytes": region.layer_bytes})  # fmt: skip
        start, end = int(payload["start"]), int(payload["end"])
        if end <= start:
            return
        row = self.links.row_bytes
        for layer in range(self.layers):
            first = region.layer_offset_bytes(layer) + start * row
            notice = {"kind": "rows", "rid": state.rid, "step": payload["step"], "layer": layer}
            self.links.link.write(
                pe,
                "dram",
                int(payload["offset"]) + layer * int(payload["layer_bytes"]),
                self.links.dram_view[first : first + (end - start) * row],
                notice,
                ready_s=ready_s,
            )

    def load(self) -> dict[str, Any]:
        return {"read_q_tokens": self.links.snic.read_queue.queued_tokens}

    def stats(self) -> dict[str, float]:
        """Cumulative counters for the node's report (/metrics)."""
        return {
            "decode_restarts": float(self.decode_restarts),
            "decode_restart_s": self.decode_restart_s,
            **self.work.stats(),
        }

    def close(self) -> None:
        self._decode.put(None)
        self._worker.join(timeout=5)
        for pool in (self._h2d, self._persist, self._tx):
            pool.shutdown(wait=False, cancel_futures=True)

    # ---- H2D, persistence -----------------------------------------------------------------------------
    def _to_cache(self, state: _DeRequest, prompt: list[int], first_token: int, *, paced: bool) -> None:
        """The one-shot H2D of the whole prompt KV into the paged cache."""
        state.landed.wait()
        assert state.region is not None
        if paced:  # DE DRAM -> DE CNIC (RDMA loopback) -> HBM, paper §5
            self.links.cnic.rx.transmit(len(prompt) * self.links.row_bytes * self.layers)
        device = self.model.config.device
        self.cache.allocate(state.rid, len(prompt))
        for layer in range(self.layers):
            self.cache.write(state.rid, layer, 0, region_layer(self.links, state.region, layer, len(prompt),
                                                                 device=device))  # fmt: skip
        with self._lock:
            state.token_ids = [*prompt, first_token]
            state.in_cache = True

    def _do_h2d(self, message: Message) -> None:
        state = self._state(int(message["rid"]))
        with self.links.spans.span("de.h2d", rid=state.rid, tokens=len(message["token_ids"])):
            self._to_cache(state, list(message["token_ids"]), int(message["first_token"]), paced=True)
        with self._lock:
            state.h2d_done = True
        self._maybe_free_region(state)
        self.links.emit({"type": "h2d_done", "rid": state.rid})

    def _do_persist(self, message: Message) -> None:
        """Copy the blocks out (landing region, or the cache: the D2H) and hand them to the writer
        without waiting: the next persist's bytes queue on the SNIC behind these (`PipelinedWriter`)."""
        rid, from_hbm = int(message["rid"]), bool(message["from_hbm"])
        state = self._state(rid)
        if not from_hbm:
            state.landed.wait()
        start, end = int(message["start_tokens"]), int(message["end_tokens"])
        with self.links.spans.span("de.persist_copy", rid=rid, tokens=end - start, from_hbm=from_hbm):
            future = self._write_blocks(state, start, end, from_hbm=from_hbm)

        def persisted(_: object = None) -> None:
            if not from_hbm:
                with self._lock:
                    state.dram_persists -= 1
                self._maybe_free_region(state)
            self.links.emit({"type": "persist_done", "rid": rid, "from_hbm": from_hbm})

        if future is None:
            persisted()
        else:
            future.add_done_callback(persisted)

    def _write_blocks(self, state: _DeRequest, start: int, end: int, *, from_hbm: bool) -> Future[int] | None:
        """Hand whole blocks [start, end) to the writer; its future gives the bytes once all are durable
        (a failed write is counted and logged by the writer, and serving goes on without it)."""
        bt = self.links.block_tokens
        with self._lock:
            ids = list(state.token_ids[:end])
        keys = block_keys(ids, bt)
        writes = []
        for b in range(start // bt, end // bt):
            if from_hbm:
                rows = self.cache.full_block(state.rid, b).contiguous().cpu()  # .cpu() is the D2H
                data: Any = rows.view(torch.uint8).reshape(-1).numpy().data
            else:
                assert state.region is not None
                row = self.links.row_bytes
                parts = []
                for layer in range(self.layers):
                    first = state.region.layer_offset_bytes(layer) + b * bt * row
                    parts.append(bytes(self.links.dram_view[first : first + bt * row]))
                data = b"".join(parts)
            parent = keys[b - 1] if b else ROOT_KEY
            writes.append(BlockWrite(key=keys[b], data=data, num_layers=self.layers, parent=parent))
        if not writes:
            return None
        return self.links.writer.submit(WriteJob(job_id=f"w{state.rid}.{start}", blocks=tuple(writes)))

    def _maybe_free_region(self, state: _DeRequest) -> None:
        with self._lock:
            region = state.region
            if region is None or state.dram_persists or not (state.h2d_done or state.released):
                return
            state.region = None
        self.links.dram.free(region)

    # ---- decode -------------------------------------------------------------------------------------
    def _decode_loop(self) -> None:
        name_os_thread("de-decode")  # the engine thread, as calibration and profilers see it
        while (message := self._decode.get()) is not None:
            if message["type"] == "release":
                self._release(message)
            else:
                spans = self.links.spans
                with self.work.timed(), spans.span("de.run", step=message["step"], rids=message["batch"]):
                    self._step(message)

    def _step(self, message: Message) -> None:
        """One run: the joiners' KV into the cache (oracle), then up to `steps` steps, stopping early
        at a step boundary when the scheduler cut this run (a joiner waits). A request that ends inside
        the run (EOS, stop token, `decode_stop`) is computed no further; the run reports it in `finished`
        with its output length, and stops once nothing is left (at least one step is reported)."""
        # The restart ends where this run's piece begins: an oracle joiner's inline KV copy below is
        # work of the piece (EngineWork times it), not part of the wait between runs.
        self._count_restart({int(rid) for rid in message["batch"]})
        for join in message["join"]:
            self._join(join, inline_io=bool(message["inline_io"]))
        states = [self._state(int(rid)) for rid in message["batch"]]
        run, steps = int(message["step"]), int(message.get("steps", 1))
        spans = self.links.spans
        out: dict[int, list[int]] = {s.rid: [] for s in states}
        finished: list[list[Any]] = []
        done = 0
        while done < steps and not (done and self._cut_run == run):
            running = self._still_running(states, finished)
            if not running:
                break
            contexts = [len(s.token_ids) - 1 for s in running] if spans.on else []
            with spans.span("de.model", step=run, contexts=contexts):
                logits = self.model.decode_step_paged(self.cache, [s.rid for s in running],
                                                      [s.token_ids[-1] for s in running])  # fmt: skip
            with spans.span("de.sample", step=run, batch=len(running)):
                self._sample(running, logits, out, finished)
            done += 1
        self._still_running(states, finished)  # a cancel that came during the last step
        tokens = [[rid, got] for rid, got in out.items()]
        self._last_run = (time.monotonic(), frozenset(s.rid for s in states))
        report: Message = {"type": "decode_done", "step": run, "steps": max(1, done), "tokens": tokens}
        if finished:
            report["finished"] = finished
        self.links.emit(report)

    def _sample(
        self,
        running: list[_DeRequest],
        logits: torch.Tensor,
        out: dict[int, list[int]],
        finished: list[list[Any]],
    ) -> None:
        """Each running request's next token from its row of the step's logits, and its stop rule."""
        for state, row in zip(running, logits, strict=True):
            token = sample_next(row, state.sampling, state.output, position=len(state.token_ids))
            with self._lock:
                state.token_ids.append(token)
            state.output.append(token)  # one append per token: no copy of the output so far
            state.generated += 1
            out[state.rid].append(token)
            state.finish_reason = finish_reason(state.sampling, state.output, state.max_tokens)
            if state.finish_reason is not None:
                finished.append([state.rid, state.generated, state.finish_reason])

    def _join(self, join: dict[str, Any], *, inline_io: bool) -> None:
        """A request enters the batch: its stop rule, and (oracle: no H2D command) its KV into the cache."""
        state = self._state(int(join["rid"]))
        if inline_io and not state.in_cache:
            with self.links.spans.span("de.join_copy", rid=state.rid, tokens=len(join["token_ids"])):
                self._to_cache(state, list(join["token_ids"]), int(join["first_token"]), paced=False)
            with self._lock:
                state.h2d_done = True
            self._maybe_free_region(state)
        state.prompt_tokens = len(join["token_ids"])
        state.output = state.token_ids[state.prompt_tokens :]  # token 1, from the prefill node
        state.max_tokens, state.generated = int(join["max_tokens"]), 1
        state.sampling = SamplingParams.from_message(join.get("sampling") or {})
        state.finish_reason = None

    def _still_running(self, states: list[_DeRequest], finished: list[list[Any]]) -> list[_DeRequest]:
        """The states still decoding; those cancelled since the last step end now ("abort"), and one whose
        output is already at its (cut) length ends without a step."""
        with self._lock:
            stopped = set(self._stopped)
        for state in states:
            if state.finish_reason is None and (state.rid in stopped or state.generated >= state.max_tokens):
                state.finish_reason = "abort"
                finished.append([state.rid, state.generated, "abort"])
        return [s for s in states if s.finish_reason is None]

    def _count_restart(self, batch: set[int]) -> None:
        ended_s, previous = self._last_run
        if previous & batch:  # the batch went on: the time since the last run ended was the restart
            self.decode_restarts += 1
            self.decode_restart_s += time.monotonic() - ended_s

    def _release(self, message: Message) -> None:
        rid = int(message["rid"])
        with self._lock:
            state = self.requests.pop(rid, None)
            self._stopped.discard(rid)
        if state is None:
            return
        if state.in_cache:
            self.cache.free(rid)
        state.released = True
        self._maybe_free_region(state)
