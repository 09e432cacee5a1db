"""The decode engine (DE) of a node process: DE buffer, one-shot H2D, continuous batching, persistence.

NOTE: a request's life on the DE (paper §4.1, Fig. 4):

    admit      region for the whole prompt KV in the DE DRAM buffer (layer-major)
               DE read path: hit Layer Blocks storage ─DE SNIC─► region rows [0, hit)
               tell the PE where to write ("de_ready": region offset, usable hit)
    pull       (DE read path) push hit layer l ─DE CNIC─► PE DRAM, in layer order
    prefilled  all layers are in the region (PE wrote hit+miss, or only miss beside our hits)
               one H2D into the KV cache ("HBM"), free the region, decode with the batch
    decode     every step: one token per running request; each Full Block persisted as soon as it
               fills (D2H, then ─DE SNIC tx─► storage, §4.1); "finished" once its writes landed, so the
               next round of the same agent sees them as hits.

Requests finish after exactly `max_tokens` tokens (the load generator asks for each round's count, A.3).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from dualpath.kvcache import ROOT_KEY, BlockKey, block_keys
from dualpath.runtime.control import Message
from dualpath.runtime.dram import Region
from dualpath.runtime.kvio import region_layer, scatter_hits, submit_hit_read, usable_hit_tokens
from dualpath.runtime.model.paged_cache import PagedKVCache
from dualpath.runtime.node import NodeLinks
from dualpath.transfer import BlockWrite, ReadResult, WriteJob
from dualpath.transfer.types import Notice

_ALLOC_RETRY_S = 0.005
_IDLE_WAIT_S = 0.002  # with nothing to decode, wait this long for an arrival (or a persist to land)


@dataclass
class Sequence:
    """One running request; its KV rows live in the engine's `PagedKVCache` under `rid`."""

    rid: int
    token_ids: list[int]  # prompt + generated
    length: int  # tokens with KV in the cache
    max_tokens: int
    generated: int
    persisted_blocks: int
    last_key: BlockKey
    writes: list[Future[int]] = field(default_factory=list)


@dataclass
class DecodeJob:
    rid: int
    token_ids: list[int]
    max_tokens: int
    pe: str
    de_read: bool
    hit_tokens: int
    keys: list[BlockKey]
    region: Region | None = None
    times: dict[str, float] = field(default_factory=dict)  # wall-clock milestones (PE's merged in)


class DecodeEngine:
    def __init__(self, links: NodeLinks) -> None:
        self.links = links
        self.model = links.model
        self.layers = self.model.config.num_layers
        self.jobs: dict[int, DecodeJob] = {}
        bt = links.block_tokens
        # The DE's "HBM": a paged pool of Full-Block pages; the scheduler reserves len_r in it (§6.2).
        self.cache = PagedKVCache(
            self.model.config, num_pages=-(-links.spec.hbm_tokens // bt) + 1, block_tokens=bt
        )
        self._lock = threading.Lock()
        self._arrivals: queue.Queue[tuple[DecodeJob, int] | None] = queue.Queue()
        self._tx = ThreadPoolExecutor(1, thread_name_prefix="de-send")
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._decode_loop, name="de-decode", daemon=True)
        self._worker.start()

    # ---- control ------------------------------------------------------------------------------
    def on_command(self, message: Message) -> None:
        if message["type"] != "admit":
            return
        ids = list(message["token_ids"])
        hit = int(message["hit_tokens"])
        job = DecodeJob(
            rid=int(message["rid"]),
            token_ids=ids,
            max_tokens=int(message["max_tokens"]),
            pe=message["pe"],
            de_read=int(message["de_read_tokens"]) > 0,
            hit_tokens=hit,
            keys=block_keys(ids[:hit], self.links.block_tokens),
        )
        job.times["de_assigned"] = time.time()
        with self._lock:
            self.jobs[job.rid] = job
        self._admit(job)

    def _admit(self, job: DecodeJob) -> None:
        reading = job.de_read and job.hit_tokens > 0
        region = self._alloc(len(job.token_ids))
        staging = self._alloc(job.hit_tokens) if reading and region is not None else None
        if region is None or (reading and staging is None):  # backpressure: the DE buffer is full
            if region is not None:
                self.links.dram.free(region)
            threading.Timer(_ALLOC_RETRY_S, self._admit, args=(job,)).start()
            return
        job.region = region
        if staging is not None:
            future = submit_hit_read(self.links, f"de{job.rid}", job.keys, region, staging)
            future.add_done_callback(lambda f: self._on_read(job, staging, f.result()))
        else:
            self._announce(job)

    def _alloc(self, tokens: int) -> Region | None:
        return self.links.dram.allocate(
            num_layers=self.layers, tokens=tokens, bytes_per_token_per_layer=self.links.row_bytes
        )

    def _on_read(self, job: DecodeJob, staging: Region, result: ReadResult) -> None:
        assert job.region is not None
        self.links.count_corrupt(len(set(result.corrupt_keys)))
        job.hit_tokens = usable_hit_tokens(result, job.keys, self.links.block_tokens)
        scatter_hits(self.links, staging, job.region, job.hit_tokens)
        self.links.dram.free(staging)
        job.times["read_end"] = time.time()
        self._announce(job)

    def _announce(self, job: DecodeJob) -> None:
        assert job.region is not None
        notice = {
            "kind": "de_ready",
            "rid": job.rid,
            "offset": job.region.offset_bytes,
            "layer_bytes": job.region.layer_bytes,
            "hit_tokens": job.hit_tokens,
        }
        self.links.raw.notify(job.pe, notice)

    def on_notice(self, notice: Notice) -> None:
        payload = notice.payload
        with self._lock:
            job = self.jobs.get(int(payload["rid"]))
        if job is None:
            return
        if payload["kind"] == "pull":
            self._tx.submit(self._push_hits, job, int(payload["offset"]), int(payload["layer_bytes"]))
        elif payload["kind"] == "prefilled":
            job.hit_tokens = int(payload["hit_tokens"])
            job.times.update(payload.get("times", {}))
            self._arrivals.put((job, int(payload["first_token"])))

    def _push_hits(self, job: DecodeJob, offset: int, layer_bytes: int) -> None:
        """DE read path, per layer in order: DE DRAM -> DE CNIC => PE CNIC -> PE (paper Fig. 4b, 3-5)."""
        assert job.region is not None
        nbytes = job.hit_tokens * self.links.row_bytes
        for layer in range(self.layers):
            start = job.region.layer_offset_bytes(layer)
            notice = {"kind": "hit_layer", "rid": job.rid, "layer": layer}
            self.links.link.write(
                job.pe,
                "dram",
                offset + layer * layer_bytes,
                self.links.dram_view[start : start + nbytes],
                notice,
            )

    def load(self) -> dict[str, Any]:
        with self._lock:
            jobs = list(self.jobs.values())
        reserved = sum(len(j.token_ids) + j.max_tokens for j in jobs)  # len_r (paper §6.2)
        return {
            "seq": len(jobs),
            "tok": reserved,
            "read_q_tokens": self.links.snic.read_queue.queued_tokens,
            "free_hbm_tokens": self.links.spec.hbm_tokens - reserved,
            "known": [j.rid for j in jobs],
        }

    def close(self) -> None:
        self._stop.set()
        self._arrivals.put(None)
        self._worker.join(timeout=5)
        self._tx.shutdown(wait=False, cancel_futures=True)

    # ---- decode -----------------------------------------------------------------------------------
    def _decode_loop(self) -> None:
        running: list[Sequence] = []
        draining: list[Sequence] = []
        while not self._stop.is_set():
            self._take_arrivals(running, block=not running)  # never spin while persists drain
            if running:
                self._step(running)
            for seq in [s for s in running if s.generated >= s.max_tokens]:
                running.remove(seq)
                draining.append(seq)
            for seq in [s for s in draining if all(w.done() for w in s.writes)]:
                draining.remove(seq)
                self._finish(seq)

    def _take_arrivals(self, running: list[Sequence], *, block: bool) -> None:
        try:
            item = self._arrivals.get(timeout=_IDLE_WAIT_S) if block else self._arrivals.get_nowait()
            while item is not None:
                running.append(self._start_sequence(*item))
                item = self._arrivals.get_nowait()
        except queue.Empty:
            pass

    def _start_sequence(self, job: DecodeJob, first_token: int) -> Sequence:
        """The one-shot H2D of the whole prompt KV, then the DE buffer region is free again (§4.1)."""
        assert job.region is not None
        prompt = len(job.token_ids)
        device = self.model.config.device
        self.cache.allocate(job.rid, prompt)
        for layer in range(self.layers):
            self.cache.write(
                job.rid, layer, 0, region_layer(self.links, job.region, layer, prompt, device=device)
            )
        self.links.dram.free(job.region)
        job.times["decode_start"] = time.time()
        bt = self.links.block_tokens
        hit_blocks = job.hit_tokens // bt
        keys = block_keys(job.token_ids[: hit_blocks * bt], bt)
        seq = Sequence(
            rid=job.rid,
            token_ids=[*job.token_ids, first_token],
            length=prompt,
            max_tokens=job.max_tokens,
            generated=1,
            persisted_blocks=hit_blocks,
            last_key=keys[-1] if keys else ROOT_KEY,
        )
        self._persist_full_blocks(seq)
        return seq

    def _step(self, running: list[Sequence]) -> None:
        """One continuous-batching step: every running sequence advances by one token."""
        contexts = [self.cache.context(s.rid) for s in running]
        out = self.model.decode_step([s.token_ids[-1] for s in running], contexts)
        next_ids = out.logits.argmax(dim=-1).tolist()
        items = []
        for i, seq in enumerate(running):
            self.cache.append(seq.rid, [kv[i : i + 1] for kv in out.kv])
            seq.length += 1
            seq.token_ids.append(int(next_ids[i]))
            seq.generated += 1
            items.append([seq.rid, [int(next_ids[i])]])
            self._persist_full_blocks(seq)
        self.links.send({"type": "tokens", "items": items})

    def _persist_full_blocks(self, seq: Sequence) -> None:
        """Each Full Block whose KV is complete goes to storage through the DE's SNIC (tx), §4.1."""
        bt = self.links.block_tokens
        while (seq.persisted_blocks + 1) * bt <= seq.length:
            b = seq.persisted_blocks
            (key,) = block_keys(seq.token_ids[b * bt : (b + 1) * bt], bt, parent=seq.last_key)
            rows = (
                self.cache.full_block(seq.rid, b).contiguous().cpu()
            )  # a page = a Full Block; .cpu() is the D2H
            data = memoryview(rows.view(torch.uint8).reshape(-1).numpy())
            write = BlockWrite(key=key, data=data, num_layers=self.layers, parent=seq.last_key)
            seq.writes.append(self.links.writer.submit(WriteJob(job_id=f"w{seq.rid}.{b}", blocks=(write,))))
            seq.last_key = key
            seq.persisted_blocks += 1

    def _finish(self, seq: Sequence) -> None:
        self.cache.free(seq.rid)
        with self._lock:
            job = self.jobs.pop(seq.rid)
        job.times["finished"] = time.time()
        self.links.send(
            {"type": "finished", "rid": seq.rid, "hit_tokens": job.hit_tokens, "times": job.times}
        )
