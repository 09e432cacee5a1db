"""`ClusterCore`: the whole decision core of a PD-disaggregated cluster, driven by `on_*` calls.

Both drivers run this object: the simulator with a virtual clock and a cost model, the runtime with
wall-clock time and real bytes. Each `on_*` / `fetch` call returns the commands to execute now
(`dualpath.engine.commands`), in one list it makes: the helpers it goes through append theirs to it
(their `out` parameter), in the order they run. Node ids: PE nodes 0..P-1, DE nodes P..P+D-1; engine
id = node·g + rank.

Life of a request (each arrow is a call from the driver):

    submit ─fetch─► Assignment ─► StartRead(s) ─on_read_done─► [landing reserved in DE buffer] ─► ready
      ─► StartPrefillStep ─on_prefill_step_done─► token 1 ─on_kv_out_done─► StartH2D (+ StartPersist of
      the prompt's new blocks from DRAM) ─on_h2d_done─► decode run ─advance_decode─► token 2, StartPersist
      per filled block, last token ─on_persist_done─► RequestDone

DRAM buffers (admission when full): a PE-side read reserves its hit KV in the PE buffer; the DE buffer
holds the request's whole prompt KV (the landing space), reserved by its DE-side read, or after its
PE-side read when it has none. A request is prefillable only with its landing reserved, so a PE never
waits on a full DE buffer mid-step and the buffers cannot deadlock. DE HBM is reserved at DE placement.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Final

from dualpath.config.specs import SchedulerSpec
from dualpath.engine.buffers import CapacityPool
from dualpath.engine.commands import (
    Command,
    DecodeChanged,
    RequestDone,
    RequestView,
    StartH2D,
    StartPersist,
    StartPrefillStep,
    StartRead,
    StepItem,
    TokenMilestone,
)
from dualpath.engine.decode import DecodeEngine, DecodeNode
from dualpath.engine.modes import Mode
from dualpath.engine.prefill import PrefillEngine, PrefillNode, step_item
from dualpath.engine.storage_reader import DEFAULT_MAX_INFLIGHT_READS, ReadPart, StorageReader
from dualpath.policy.batching import (
    DEFAULT_MAX_BATCH_NEW_TOKENS,
    AttentionTimeFn,
    BatchItem,
    PrefillWork,
    pack_by_compute_quota,
    pack_by_token_budget,
)
from dualpath.policy.decisions import Assignment, BatchDecision, DecisionLog
from dualpath.policy.fifo import Fifo
from dualpath.policy.pe_assign import overloaded
from dualpath.policy.read_path import make_read_path_policy
from dualpath.policy.scheduler import RequestScheduler
from dualpath.policy.types import EngineLoad
from dualpath.request import NO_DRAM_HOLD, Phase, Request, RequestsById


@dataclass(frozen=True, kw_only=True)
class CoreConfig:
    num_prefill_nodes: int
    num_decode_nodes: int
    engines_per_node: int
    mode: Mode
    scheduler: SchedulerSpec
    kv_bytes_per_token: float  # all layers (a Full Block's bytes / block_tokens)
    dram_buffer_bytes: float  # PE/DE buffer per node (paper A.4)
    de_hbm_kv_tokens: int  # KV capacity of one DE's HBM
    pe_hbm_kv_tokens: int  # KV capacity of one PE's HBM (bounds basic's whole-KV batches)
    read_tokens_per_s: float  # one node's storage path (its SNIC), in hit tokens/s
    alpha_tokens: float  # §6.1: tokens the storage path reads in alpha_read_s
    beta_tokens: float  # §6.1: miss tokens one PE computes in beta_compute_s (C1: compute_tok > β)
    read_path: str | None = None  # overrides mode.read_path
    max_inflight_reads: int = DEFAULT_MAX_INFLIGHT_READS
    max_batch_new_tokens: int = DEFAULT_MAX_BATCH_NEW_TOKENS
    # A decode run is at most this many steps (`start_decode_run`); None: up to the next last token.
    # A driver that reports tokens only at a run's end bounds how late they come out with it.
    max_decode_run_steps: int | None = None


_ABANDONABLE: Final = (Phase.QUEUED, Phase.ASSIGNED, Phase.READING, Phase.READY)
_DOWN_GROUP_TOK: Final = 2**62  # a dead DE group's Σtok as the router sees it: phase 1 routes nothing there


@dataclass(frozen=True)
class NodeDown:
    """What `on_node_down` decided: requests to submit again (continuations), commands to run now."""

    replan: tuple[RequestView, ...]  # as they were when the node died
    commands: tuple[Command, ...]


class ClusterCore:
    def __init__(
        self,
        config: CoreConfig,
        *,
        attention_time_s: AttentionTimeFn | None = None,
        log: DecisionLog | None = None,
    ) -> None:
        if config.mode.quota_batching and attention_time_s is None:
            raise ValueError(f"mode {config.mode.name} batches by compute quota: pass attention_time_s")
        self.config = config
        # Read per request and per batch: plain fields, not lookups on the (interpreted) scheduler spec.
        self._block_tokens = config.scheduler.block_tokens
        self._compute_quota_s = config.scheduler.compute_quota_s
        self.mode = config.mode
        self.log = log if log is not None else DecisionLog()
        self._attention_time_s = attention_time_s
        g, p, d = config.engines_per_node, config.num_prefill_nodes, config.num_decode_nodes
        self.pe_nodes = {n: PrefillNode(n, [PrefillEngine(n * g + i, n) for i in range(g)]) for n in range(p)}
        self.de_nodes = {
            n: DecodeNode(
                n,
                [DecodeEngine(n * g + i, n, config.de_hbm_kv_tokens) for i in range(g)],
                block_tokens=config.scheduler.block_tokens,
            )
            for n in range(p, p + d)
        }
        # Per-node and per-engine state in lists indexed by id (nodes 0..P+D-1, PE engines 0..P·g-1): read
        # on every placement, read and step, where a dict costs a boxed key and a hash lookup each time.
        self._pe = [e for node in self.pe_nodes.values() for e in node.engines]  # by engine id
        # The nodes themselves likewise (`pe_node`, `de_node`: PE node n at n, DE node n at n - P), kept
        # with the dicts `pe_nodes` and `de_nodes`, the view by id for iteration and inspection.
        self._pe_node_at = list(self.pe_nodes.values())
        self._de_node_at = list(self.de_nodes.values())
        self._num_pe_nodes = p
        # Each node's engine reports (§6.1), one object per engine, rewritten at each of its fetches
        # (`_pe_loads`, `_de_loads`): the scheduler reads them during the fetch only, and a fetch of a
        # group would otherwise build one report per engine each time.
        self._reports = [
            [EngineLoad(engine_id=e.engine_id, node_id=n, seq=0, tok=0, compute_tok=0, read_q_tokens=0)
             for e in node.engines]
            for nodes in (self.pe_nodes, self.de_nodes) for n, node in nodes.items()
        ]  # fmt: skip
        # PE groups with an engine at or under β (Algorithm 1's C2 ∪ C3 not empty), kept as compute_tok
        # changes, so that a fetch need not test every engine of every group (`_all_over_beta`).
        self._pe_open = {n for n, node in self.pe_nodes.items() if not self._all_over_beta(node)}
        self._pe_open_ids = sorted(self._pe_open)  # the same ids in id order: a fetch's rotation
        self.readers = [StorageReader(n, max_inflight_reads=config.max_inflight_reads) for n in range(p + d)]
        self.buffers = [
            CapacityPool(config.dram_buffer_bytes, name=f"node{n}/dram_buffer") for n in range(p + d)
        ]
        # Landings waiting for a DE node's buffer (a PE node's queue stays empty).
        self._landing_wait: list[Fifo[Request]] = [Fifo() for _ in range(p + d)]
        # Submitted and not yet forgotten, by id: both drivers give ids in increasing order.
        self._active = RequestsById()
        self._early_ends: dict[int, int] = {}  # request -> output tokens, ended before its DE placement
        self._fetches = 0
        self._fetch_wanted = False  # `wants_fetch`
        self.down: set[int] = set()  # nodes marked down (`on_node_down`) until they join again
        # The same by node id, for the fetch's checks: a list read, not a set's hash and lookup per node.
        self._is_down = [False] * (p + d)
        self.scheduler = RequestScheduler(
            pe_nodes={n: [e.engine_id for e in node.engines] for n, node in self.pe_nodes.items()},
            de_nodes={n: [e.engine_id for e in node.engines] for n, node in self.de_nodes.items()},
            spec=config.scheduler,
            read_path=make_read_path_policy(config.read_path or config.mode.read_path),
            read_tokens_per_s={n: config.read_tokens_per_s for n in range(p + d)},
            alpha_tokens=config.alpha_tokens,
            beta_tokens=config.beta_tokens,
            scheduling=config.mode.scheduling,
            log=self.log,
        )

    # ---- ids -----------------------------------------------------------------------------------
    def node_of_engine(self, engine_id: int) -> int:
        return engine_id // self.config.engines_per_node

    def de_engine(self, engine_id: int) -> DecodeEngine:
        return self.de_node(self.node_of_engine(engine_id)).engine(engine_id)

    def pe_node(self, node_id: int) -> PrefillNode:
        """`pe_nodes[node_id]` (KeyError for another id), read from the list by id: no hashing per call."""
        if not 0 <= node_id < self._num_pe_nodes:
            raise KeyError(f"node {node_id} is not a PE node")
        return self._pe_node_at[node_id]

    def de_node(self, node_id: int) -> DecodeNode:
        """`de_nodes[node_id]` (KeyError for another id), read from the list by id: no hashing per call."""
        index = node_id - self._num_pe_nodes
        if not 0 <= index < len(self._de_node_at):
            raise KeyError(f"node {node_id} is not a DE node")
        return self._de_node_at[index]

    # ---- intake and fetches --------------------------------------------------------------------
    @property
    def wants_fetch(self) -> bool:
        """When the group leaders should fetch (§6.1 says "periodically"; fetching on change sees the same
        state without idle polls): something that can unblock a placement changed since the last fetch and
        requests wait. The changes: a round arrived, a PE step finished (tok_e fell), DE HBM was freed (a
        last token, an early end, a placement given back), a request left, a node went down or came up.
        A finished read needs none: read queues only steer a placement, and every fetch takes fresh
        reports. Drivers call `fetch` once at the end of the instant in which this became true."""
        return self._fetch_wanted and self.scheduler.waiting > 0

    def submit(self, request: Request, now_s: float) -> list[Command]:
        """A new request (ids increase from one submit to the next: `RequestsById`)."""
        self._active.add(request)
        self.scheduler.submit(request)
        self._fetch_wanted = True
        return []

    def fetch(self, now_s: float) -> list[Command]:
        """Every group's leader fetches (DE groups first, then PE groups, in id order)."""
        out: list[Command] = []
        progress = True
        round_robin = self.mode.scheduling == "round-robin"
        de_up = not self.down or len(self.down.intersection(self.de_nodes)) < len(self.de_nodes)
        if not round_robin and de_up and self.scheduler.waiting > self.scheduler.pe_queue_len:
            self._fetch_de_groups_two_phase()
        while round_robin and progress and self.scheduler.waiting > self.scheduler.pe_queue_len:
            # Round-robin places one turn per group per round: repeat rounds.
            progress = False
            for node in self.de_nodes.values():
                progress = self._fetch_de_group(node) or progress
        # Leaders fetch independently in the paper; rotating who fetches first keeps any one PE
        # group from always having first pick of Q.
        self._fetches += 1
        visit = self._pe_fetch_order(round_robin) if self.scheduler.pe_queue_len else ()
        for node_id in visit:
            if not self.scheduler.pe_queue_len:
                break
            if self._is_down[node_id]:
                continue  # a dead group fetches nothing (`on_node_down`)
            if not round_robin and node_id not in self._pe_open:
                continue  # C2 and C3 empty: Algorithm 1 places nothing here (speed only, same decisions)
            pnode = self.pe_node(node_id)
            for a in self.scheduler.fetch_pe_group(pnode.node_id, self._pe_loads(pnode)):
                self._on_assigned(a, out)
        self._fetch_wanted = False
        return out

    def _pe_fetch_order(self, round_robin: bool) -> list[int]:
        """The PE groups in this fetch's rotation: every group from group `_fetches mod P` on, wrapping.

        Two-phase scheduling visits only the open ones (`_pe_open`; the loop skips the others), so they
        are taken from the open set in that order (O(open), not O(P) per fetch: 48 PE groups at
        48P96D). The same groups in the same order: during a fetch only the group that fetches changes
        its compute_tok (Algorithm 1 places on its own engines), so no other group opens meanwhile.
        PE node ids are 0..P-1 (`__init__`), so a group's place in the rotation is its id.
        """
        num = len(self.pe_nodes)
        if not num:
            return []
        start = self._fetches % num
        if round_robin:
            return [(start + k) % num for k in range(num)]
        ids = self._pe_open_ids
        cut = 0  # bisect_left by hand: a few ids, and a module function is a generic call natively
        while cut < len(ids) and ids[cut] < start:
            cut += 1
        return ids[cut:] + ids[:cut]

    def _fetch_de_group(self, node: DecodeNode) -> bool:
        """One DE group leader's fetch (§6.2); True if it placed a request."""
        if not self.scheduler.has_de_work(node.node_id, self._max_free_hbm_tokens(node)):  # a report only
            self.scheduler.note_de_group(
                node.node_id, read_q_tokens=self.readers[node.node_id].read_q_tokens, tok=node.reserved_tokens
            )
            return False
        placed = self.scheduler.fetch_de_group(node.node_id, self._de_loads(node))
        if self._is_down[node.node_id]:  # round robin: a dead group's engines lose their turns (no room)
            assert not placed
        for request, engine in placed:
            e = self.de_engine(engine)
            node.reserve(e, request.total_tokens)
            e.seq += 1
            if self._early_ends:
                self._apply_early_end(request)
        if placed:
            self.scheduler.mark_de_report_due(node.node_id)  # its Σtok grew after its report
        return bool(placed)

    def _fetch_de_groups_two_phase(self) -> None:
        """Every DE group's fetch, in id order, skipping those that would only report what the scheduler
        already holds (`RequestScheduler.de_groups_to_visit`; speed only, same decisions: 96 groups at
        48P96D, fetched on every change). The first group routes the whole global queue, if any, to the
        groups' private queues (two-phase, one round), so the set to visit is known after it."""
        after = -1
        if self.scheduler.global_queue_len:
            first = next(node for n, node in self.de_nodes.items() if n not in self.down)
            self._fetch_de_group(first)
            after = first.node_id
        for node_id in self.scheduler.de_groups_to_visit(after=after):
            if not self._is_down[node_id]:  # its report stays "full" (`on_node_down`)
                self._fetch_de_group(self.de_node(node_id))

    def _all_over_beta(self, node: PrefillNode) -> bool:
        """Every engine of the PE group is in C1 (compute_tok > β). While Q waits, every fetch would
        otherwise build this group's reports only to place nothing; its read queue, which the skipped
        report carries, steers only placements on this group."""
        beta = self.config.beta_tokens
        return all(overloaded(e.compute_tok, beta) for e in node.engines)

    def _note_compute_tok(self, node: PrefillNode) -> None:
        """An engine of `node` changed its compute_tok: keep `_pe_open` equal to the test it caches."""
        node_id = node.node_id
        if self._all_over_beta(node):
            if node_id in self._pe_open:
                self._pe_open.discard(node_id)
                self._pe_open_ids.remove(node_id)
        elif node_id not in self._pe_open:
            self._pe_open.add(node_id)
            bisect.insort(self._pe_open_ids, node_id)

    def _max_free_hbm_tokens(self, node: DecodeNode) -> int:
        """The most free HBM on one DE of the group (0 for a dead group: its reports say "full")."""
        if self._is_down[node.node_id]:
            return 0
        most = 0
        for e in node.engines:
            free = e.free_hbm_tokens
            if free > most:
                most = free
        return most

    def _de_loads(self, node: DecodeNode) -> list[EngineLoad]:
        """The group's reports now (its `_reports`, every field rewritten)."""
        q = self.readers[node.node_id].read_q_tokens
        down = self._is_down[node.node_id]
        engines, reports = node.engines, self._reports[node.node_id]
        for i in range(len(engines)):
            e, r = engines[i], reports[i]
            r.seq = e.seq
            r.tok = e.reserved_tokens
            r.compute_tok = 0  # a DE computes no prefill
            r.read_q_tokens = q
            r.free_hbm_tokens = 0 if down else e.free_hbm_tokens
        return reports

    def _pe_loads(self, node: PrefillNode) -> list[EngineLoad]:
        """The group's reports now (its `_reports`, every field rewritten)."""
        q = self.readers[node.node_id].read_q_tokens
        engines, reports = node.engines, self._reports[node.node_id]
        for i in range(len(engines)):
            e, r = engines[i], reports[i]
            r.seq = e.seq
            r.tok = e.tok
            r.compute_tok = e.compute_tok
            r.read_q_tokens = q
            r.free_hbm_tokens = 0
        return reports

    def _on_assigned(self, a: Assignment, out: list[Command]) -> None:
        request = self._active.at(a.request_id)
        if self.down and (
            self.node_of_engine(a.pe_engine) in self.down or self.node_of_engine(a.de_engine) in self.down
        ):
            # round robin deals PEs cluster-wide: a turn that fell on a dead node goes back to the queue
            self._release_de(request)
            self._requeue(request)
            return
        pe = self._pe[a.pe_engine]
        pe.assign(request)
        self._note_compute_tok(self.pe_node(pe.node_id))
        if self.mode.skip_io:
            self._make_ready(request, out)
            return
        pe_node, de_node = self.node_of_engine(a.pe_engine), self.node_of_engine(a.de_engine)
        kv = self.config.kv_bytes_per_token
        parts: list[ReadPart] = []
        if a.pe_read_tokens:
            parts.append(ReadPart(request_id=a.request_id, node_id=pe_node, tokens=a.pe_read_tokens,
                                  reserve_bytes=a.pe_read_tokens * kv, owner=request))  # fmt: skip
        if a.de_read_tokens:
            parts.append(ReadPart(request_id=a.request_id, node_id=de_node, tokens=a.de_read_tokens,
                                  reserve_bytes=request.prompt_tokens * kv, owner=request))  # fmt: skip
        request.parts_reading = len(parts)
        if not parts:
            self._landing_wait[de_node].append(request)
            self._admit(de_node, out)
            return
        for part in parts:
            self.readers[part.node_id].enqueue(part)
            self.scheduler.mark_de_report_due(part.node_id)
        for part in parts:
            self._admit(part.node_id, out)

    # ---- storage reads and DRAM buffers -------------------------------------------------------
    def _admit(self, node_id: int, out: list[Command]) -> None:
        """Start what the node's buffer admits: landings waiting on it first (they hold PE buffers)."""
        wait = self._landing_wait[node_id]
        pool = self.buffers[node_id]
        while wait:
            request = wait.peek()
            need = request.prompt_tokens * self.config.kv_bytes_per_token
            if not pool.can_reserve(need):
                break
            pool.reserve(request, need)
            wait.popleft()
            self._make_ready(request, out)
        reader = self.readers[node_id]
        part = reader.admit_next(pool)
        while part is not None:
            request = self._active.at(part.request_id)
            request.phase = Phase.READING
            pe_side, start_tokens = self._read_part_start(request, node_id)
            out.append(
                StartRead(
                    node_id=node_id,
                    request_id=request.request_id,
                    start_tokens=start_tokens,
                    tokens=part.tokens,
                    prompt_tokens=request.prompt_tokens,
                    pe_side=pe_side,
                )
            )
            part = reader.admit_next(pool)

    def _read_part_start(self, request: Request, node_id: int) -> tuple[bool, int]:
        """Whether the request's read on `node_id` is its PE-side part, and where in the hit it starts:
        split reads (§5) give the PE side the hit's first pe_read_tokens, the DE side the rest."""
        assert request.pe_engine is not None
        pe_side = node_id == self.node_of_engine(request.pe_engine)
        return pe_side, 0 if pe_side else request.pe_read_tokens

    def on_read_done(
        self, node_id: int, request_id: int, now_s: float, usable_tokens: int | None = None
    ) -> list[Command]:
        """A `StartRead` finished. `usable_tokens` < the part's tokens: the read found a block of its
        range corrupt or missing (DESIGN §4 "faults"; a simulated store loses nothing): the request's hit
        ends there (`_shrink_hit`)."""
        request = self._active.get(request_id)
        if request is None:
            return []  # re-planned while it read (`on_node_down`, `abandon`): its part was dropped then
        part_tokens = self.readers[node_id].finish(request_id).tokens
        self.scheduler.mark_de_report_due(node_id)
        request.parts_reading -= 1
        if usable_tokens is not None and usable_tokens < part_tokens:
            _, start_tokens = self._read_part_start(request, node_id)
            self._shrink_hit(request, start_tokens + max(0, usable_tokens))
        # A finished read frees a slot of the node's queue depth: the next queued read starts now.
        out: list[Command] = []
        self._admit(node_id, out)
        if request.parts_reading:
            return out
        assert request.de_engine is not None
        de_node = self.node_of_engine(request.de_engine)
        if self.buffers[de_node].holds(request):
            self._make_ready(request, out)
            return out
        self._landing_wait[de_node].append(request)
        self._admit(de_node, out)
        return out

    def _shrink_hit(self, request: Request, usable_hit_tokens: int) -> None:
        """The request's hit is only its first `usable_hit_tokens` (whole blocks): the rest is computed
        (its PE's first chunk starts there, and the §6.4 quota and β count those tokens: its engine's
        compute_tok grows) and persisted again (the prompt's persist starts there too). It is before its
        prefill: both of its reads finish before it is ready."""
        block = self._block_tokens
        hit = min(request.hit_tokens, usable_hit_tokens // block * block)
        if hit >= request.hit_tokens:
            return
        assert request.pe_engine is not None and request.computed_tokens == 0
        pe = self._pe[request.pe_engine]
        pe.grow_miss(request.hit_tokens - hit)
        self._note_compute_tok(self.pe_node(pe.node_id))
        request.hit_tokens = hit
        request.persisted_tokens = min(request.persisted_tokens, hit)

    def _make_ready(self, request: Request, out: list[Command]) -> None:
        assert request.pe_engine is not None
        request.phase = Phase.READY
        pe = self._pe[request.pe_engine]
        pe.ready.append(request)
        self._try_step(self.pe_node(pe.node_id), out)

    # ---- prefill -------------------------------------------------------------------------------
    def _try_step(self, node: PrefillNode, out: list[Command]) -> None:
        if node.busy or not node.has_ready:
            return
        batches = tuple(self._batch(e) for e in node.engines)
        node.step_id += 1
        node.busy = True
        node.running = batches
        out.append(
            StartPrefillStep(
                node_id=node.node_id, step_id=node.step_id, layerwise=self.mode.layerwise, batches=batches
            )
        )

    def _batch(self, engine: PrefillEngine) -> tuple[StepItem, ...]:
        if not engine.ready:
            return ()  # what packing an empty queue gives, without its generator and lists (an idle engine)
        # Lazily: packing stops at the first request that does not fit, and ready queues can be long.
        work = (
            PrefillWork(
                request_id=r.request_id,
                cached_tokens=r.cached_tokens,
                remaining_tokens=r.remaining_prefill_tokens,
            )
            for r in engine.ready
        )
        items: list[BatchItem]
        if self.mode.quota_batching:
            assert self._attention_time_s is not None
            items = pack_by_compute_quota(
                work, attention_time_s=self._attention_time_s, quota_s=self._compute_quota_s
            )
        else:
            kv_limit = None if self.mode.layerwise else self.config.pe_hbm_kv_tokens
            items = pack_by_token_budget(
                work, max_new_tokens=self.config.max_batch_new_tokens, max_kv_tokens=kv_limit
            )
        if not items:
            return ()
        self.log.record(BatchDecision(pe_engine=engine.engine_id, items=tuple(items)))
        out = []
        ready = engine.ready
        for i, item in enumerate(items):  # the packed requests are the head of the ready queue
            request = ready.at(i)
            assert item.request_id == request.request_id
            request.phase = Phase.PREFILLING
            out.append(step_item(request, engine.engine_id, item.cached_tokens, item.new_tokens))
        return tuple(out)

    def on_prefill_step_done(self, node_id: int, step_id: int, now_s: float) -> list[Command]:
        """The forward's compute finished: chunks advance, finished prefills emit token 1."""
        node = self.pe_node(node_id)
        assert node.busy and node.step_id == step_id
        out: list[Command] = []
        finished: list[StepItem] = []
        assert len(node.engines) == len(node.running)
        for k, engine in enumerate(node.engines):  # an index, not zip(strict=): a generic call natively
            for item in node.running[k]:
                request = self._active.get(item.request_id)
                if request is None or request.phase is not Phase.PREFILLING:
                    continue  # re-planned while in this step (`on_node_down`, `abandon`): its work is void
                request.computed_tokens += item.new_tokens
                if not request.is_prefilled:
                    continue
                assert engine.ready.peek() is request
                engine.ready.popleft()
                engine.finish(request)
                request.generated_tokens = 1
                request.phase = Phase.TRANSFERRING
                finished.append(item)
                out.append(self._milestone(request, 1))
                if self.buffers[node_id].holds(request):
                    self.buffers[node_id].release(request)
                    self._admit(node_id, out)
        if finished:
            self._note_compute_tok(node)
        self._fetch_wanted = True  # its engines' tok_e fell
        node.busy = False
        node.running = ()
        node.awaiting_out[step_id] = tuple(finished)
        self._try_step(node, out)
        return out

    def on_kv_out_done(self, node_id: int, step_id: int, now_s: float) -> list[Command]:
        """Every layer of the step's finished requests sits in their DE buffers (Fig. 4a step 7)."""
        out: list[Command] = []
        awaiting = self.pe_node(node_id).awaiting_out
        items = awaiting[step_id]  # `dict.pop` would be a generic method call in the compiled build
        del awaiting[step_id]
        for item in items:
            request = self._active.get(item.request_id)
            if request is not None and request.phase is Phase.TRANSFERRING:
                self._to_decode(request, out)
        return out

    # ---- decode --------------------------------------------------------------------------------
    def _to_decode(self, request: Request, out: list[Command]) -> None:
        assert request.de_engine is not None
        block = self._block_tokens
        prompt_blocks_end = request.prompt_tokens // block * block
        persisted = request.persisted_tokens
        new_blocks = prompt_blocks_end - persisted
        request.persisted_tokens = max(persisted, prompt_blocks_end)
        holds = 0
        if new_blocks > 0:
            # Oracle too (§7.1: the same work, its I/O taking no time): the next round's hit needs them.
            holds += 0 if self.mode.skip_io else 1
            request.persists_in_flight += 1
            out.append(
                StartPersist(
                    de_engine=request.de_engine,
                    request_id=request.request_id,
                    start_tokens=persisted,
                    tokens=new_blocks,
                    from_hbm=False,
                )
            )
        if request.gen_tokens == 1:  # nothing to decode: token 1 was the last
            request.dram_holds = holds
            self._finish(request, out)
            self._maybe_release_dram(request, out)
            return
        if self.mode.skip_io:
            self._join(request, out)
            return
        request.dram_holds = holds + 1
        out.append(StartH2D(de_engine=request.de_engine, request_id=request.request_id,
                            tokens=request.prompt_tokens, hit_tokens=request.hit_tokens))  # fmt: skip

    def on_h2d_done(self, request_id: int, now_s: float) -> list[Command]:
        request = self._active.get(request_id)  # one lookup: None when re-planned meanwhile
        if request is None:
            return []
        request.dram_holds -= 1
        out: list[Command] = []
        self._maybe_release_dram(request, out)
        self._join(request, out)
        return out

    def _join(self, request: Request, out: list[Command]) -> None:
        assert request.de_engine is not None
        request.phase = Phase.DECODING
        node = self.de_node(self.node_of_engine(request.de_engine))
        node.joining.append(request)
        out.append(DecodeChanged(node_id=node.node_id))

    def _maybe_release_dram(self, request: Request, out: list[Command]) -> None:
        if self.mode.skip_io or request.dram_holds > 0:
            return
        request.dram_holds = NO_DRAM_HOLD
        assert request.de_engine is not None
        de_node = self.node_of_engine(request.de_engine)
        if not self.buffers[de_node].holds(request):
            return
        self.buffers[de_node].release(request)
        self._maybe_forget(request)
        self._admit(de_node, out)

    def start_decode_run(self, node_id: int) -> int:
        """At a step boundary with no run in flight (`DecodeChanged`, or a run's end): joiners enter the
        continuous batch, and the next run's length in steps (0: nothing runs). A run goes up to the next
        last token (the batch changes there; second tokens and filled blocks before it come out of
        `advance_decode` late, their milestones back-dated by `TokenMilestone.steps_before_now`), at most
        `max_decode_run_steps`, and is cut at a step boundary when a joiner waits (`decode_cut_wanted`)."""
        node = self.de_node(node_id)
        assert not node.run_steps, f"DE node {node_id} has a run in flight"
        if not node.merge_joiners():
            return 0
        steps = node.steps_to_next_batch_change()
        cap = self.config.max_decode_run_steps
        node.run_steps = steps if cap is None else min(steps, cap)
        return node.run_steps

    def decode_cut_wanted(self, node_id: int) -> bool:
        """A run is in flight and requests wait to join: it ends at its next step boundary, where they
        merge (a `DecodeChanged` while it runs asks this)."""
        node = self.de_node(node_id)
        return bool(node.run_steps and node.joining)

    def decode_shape(self, node_id: int) -> tuple[tuple[int, int], ...]:
        """Per DE engine (batch size, Σ context tokens): the cost of the run's next step."""
        return self.de_node(node_id).shape()

    def advance_decode(self, node_id: int, steps: int, now_s: float) -> list[Command]:
        """The run in flight ended after `steps` steps (all it was given, or fewer: cut for a joiner, or
        every request in it ended early); call `start_decode_run` for the next."""
        out: list[Command] = []
        node = self.de_node(node_id)
        assert 1 <= steps <= node.run_steps, (node_id, steps, node.run_steps)
        node.run_steps = 0
        for ev in node.advance(steps):
            request = ev.request
            assert request.de_engine is not None
            if ev.second_token:
                out.append(self._milestone(request, 2, steps_before_now=node.steps_done - ev.step))
            if ev.persist_tokens:
                request.persists_in_flight += 1
                out.append(
                    StartPersist(
                        de_engine=request.de_engine,
                        request_id=request.request_id,
                        start_tokens=ev.persisted_tokens - ev.persist_tokens,
                        tokens=ev.persist_tokens,
                        from_hbm=True,
                    )
                )
            if ev.finished:
                if request.gen_tokens > 2:  # tokens 1 and 2 had their own milestones
                    out.append(self._milestone(request, request.gen_tokens))
                self._finish(request, out)
        return out

    def _milestone(self, request: Request, token_index: int, steps_before_now: int = 0) -> TokenMilestone:
        assert request.de_engine is not None
        return TokenMilestone(request_id=request.request_id, de_engine=request.de_engine, token_index=token_index,
                              last=token_index == request.gen_tokens, steps_before_now=steps_before_now)  # fmt: skip

    def finish_early(self, request_id: int, generated_tokens: int) -> None:
        """The request's output ends after `generated_tokens` tokens, before its planned `gen_tokens`: an
        EOS or stop token, or a cancel. The runtime calls this; the simulator's outputs have fixed lengths.

        Before it decodes, `generated_tokens` is 1 (the PE's token 1 still comes: its prefill is the
        work of the step it is in) and the request takes the no-decode path at its KV transfer. While
        it decodes, call it before `advance_decode` of the run in which its decode node stopped it: that
        advance finishes it with exactly `generated_tokens` tokens, and persists only blocks it filled.
        The DE HBM it no longer needs is freed now, and placements see it at the next fetch.
        """
        request = self._active.get(request_id)
        if request is None or request.phase is Phase.DONE or generated_tokens >= request.gen_tokens:
            return
        if generated_tokens < max(1, request.generated_tokens):
            raise ValueError(
                f"request {request_id}: cannot end after {generated_tokens} tokens, "
                f"{request.generated_tokens} are out"
            )
        if request.de_engine is None:  # its HBM is reserved at DE placement, for its full length
            self._early_ends[request_id] = generated_tokens
            return
        self._shorten(request, generated_tokens)

    def _apply_early_end(self, request: Request) -> None:
        generated_tokens = self._early_ends.pop(request.request_id, None)
        if generated_tokens is not None:
            self._shorten(request, generated_tokens)

    def _shorten(self, request: Request, generated_tokens: int) -> None:
        assert request.de_engine is not None
        e = self.de_engine(request.de_engine)
        node = self.de_node(e.node_id)
        node.release(e, request.gen_tokens - generated_tokens)  # `_finish` releases the rest
        request.gen_tokens = generated_tokens
        node.shorten(request)
        self._de_freed(e.node_id)

    def _de_freed(self, node_id: int) -> None:
        """DE HBM on `node_id` was freed: its group's router view is stale and a placement may fit now."""
        self.scheduler.note_de_freed(node_id)
        self._fetch_wanted = True

    def _finish(self, request: Request, out: list[Command]) -> None:
        """Last token out: free the DE's HBM reservation; done once its blocks are persisted."""
        assert request.de_engine is not None
        e = self.de_engine(request.de_engine)
        self.de_node(e.node_id).release(e, request.total_tokens)
        e.seq -= 1
        self._de_freed(e.node_id)
        request.phase = Phase.DONE
        if not request.persists_in_flight:
            self._done(request, out)

    def _done(self, request: Request, out: list[Command]) -> None:
        request.persists_in_flight = 0
        self._maybe_forget(request)
        out.append(
            RequestDone(
                request_id=request.request_id,
                pe_engine=request.pe_engine,
                de_engine=request.de_engine,
                hit_tokens=request.hit_tokens,
                pe_read_tokens=request.pe_read_tokens,
                de_read_tokens=request.de_read_tokens,
            )
        )

    def _maybe_forget(self, request: Request) -> None:
        if request.phase is Phase.DONE and not request.persists_in_flight and request.dram_holds <= 0:
            request.dram_holds = NO_DRAM_HOLD
            self._active.pop(request.request_id)

    def on_persist_done(self, request_id: int, from_hbm: bool, now_s: float) -> list[Command]:
        request = self._active.get(request_id)  # one lookup: None when re-planned meanwhile
        if request is None:
            return []
        request.persists_in_flight -= 1
        out: list[Command] = []
        if not from_hbm and not self.mode.skip_io:  # oracle: no DE buffer holds the prompt
            request.dram_holds -= 1
            self._maybe_release_dram(request, out)
        if request.phase is Phase.DONE and not request.persists_in_flight:
            self._done(request, out)
        return out

    # ---- failures and cancels (DESIGN §4 "faults") ------------------------------------------
    def on_node_down(self, node_id: int) -> NodeDown:
        """A node died or went silent: nothing is placed on it until `on_node_up`, and its work is
        re-planned. Requests that touch it (its PE, its DE, a read on its SNIC) leave the core, their
        reservations on the surviving nodes freed, and are returned in `replan`: the driver submits
        each again as a continuation (its prompt + the tokens already out, the rest of its output), so
        a PE's queue goes back to Q and a dead DE's decodes resume elsewhere from the store plus
        recompute. A request whose last token was out and only waited for its blocks' writes on the
        dead DE is done now (those blocks are simply not stored). Requests that the dead DE group had
        in its private queue go back to the global queue."""
        self.down.add(node_id)
        self._is_down[node_id] = True
        self.scheduler.down_nodes.add(node_id)
        self._fetch_wanted = True
        out: list[Command] = []
        replan: list[RequestView] = []
        for request in self._active.values():
            if not self._touches(request, node_id):
                continue
            if request.phase is Phase.DONE:
                request.persists_in_flight = 0
                request.dram_holds = NO_DRAM_HOLD
                self._done(request, out)
                continue
            replan.append(RequestView(request))
            self._evict(request, out)
        if node_id in self.de_nodes:
            for request in [r for r in self._active.values() if r.phase is Phase.QUEUED]:
                if request.de_engine is None and self.scheduler.remove(request.request_id) is not None:
                    self.scheduler.submit(request)  # routed to the dead group: route it again
            self.scheduler.note_de_group(node_id, read_q_tokens=0, tok=_DOWN_GROUP_TOK)
        self._reset_node(node_id)
        return NodeDown(replan=tuple(replan), commands=tuple(out))

    def on_node_up(self, node_id: int) -> list[Command]:
        """A node (re)joined with nothing in flight: it is placed on again, from a clean slate."""
        self.down.discard(node_id)
        self._is_down[node_id] = False
        self.scheduler.down_nodes.discard(node_id)
        self._fetch_wanted = True
        self._reset_node(node_id)
        if node_id in self.de_nodes:
            self.scheduler.note_de_group(node_id, read_q_tokens=0, tok=0)
            self.scheduler.note_de_freed(node_id)
        return []

    @property
    def nodes_up(self) -> tuple[int, int]:
        """(PE nodes up, DE nodes up): with either at 0 nothing can be served."""
        return (len(set(self.pe_nodes) - self.down), len(set(self.de_nodes) - self.down))

    def abandon(self, request_id: int) -> list[Command] | None:
        """A cancelled request leaves the cluster before its prefill runs (queued, reading or ready:
        DESIGN §4 "cancel"): it leaves the queues, its reads and buffer space are given up (the driver
        tells the nodes to drop what they hold) and it is done. None when it is further on (a
        prefill in flight computes on; a decoding request stops at its DE's next step boundary)."""
        request = self._active.get(request_id)
        if request is None or request.phase not in _ABANDONABLE:
            return None
        out: list[Command] = []
        self._evict(request, out)
        request.phase = Phase.DONE
        return out

    def _touches(self, request: Request, node_id: int) -> bool:
        """Whether the request still needs the node: its DE until done, its PE (and the PE's reads)
        until its KV has left the PE (`_to_decode`: H2D and persists are the DE's)."""
        if request.de_engine is not None and self.node_of_engine(request.de_engine) == node_id:
            return True
        past_pe = request.phase in (Phase.DECODING, Phase.DONE) or request.dram_holds != NO_DRAM_HOLD
        pe = request.pe_engine
        return pe is not None and not past_pe and self.node_of_engine(pe) == node_id

    def _evict(self, request: Request, out: list[Command]) -> None:
        """Take the request out of every book (queues, reads, buffers, PE and DE accounting); puts in
        `out` what the freed space lets start on the nodes that are up."""
        rid = request.request_id
        self._active.pop(rid)
        self._fetch_wanted = True  # what it held (tok_e, HBM, queue places) is free
        if self._early_ends:
            self._early_ends.pop(rid, None)
        request.persists_in_flight = 0
        request.dram_holds = NO_DRAM_HOLD
        if request.phase is Phase.QUEUED:
            self.scheduler.remove(rid)
        freed: set[int] = set()
        for node_id, reader in enumerate(self.readers):
            if reader.drop(rid):
                self.scheduler.mark_de_report_due(node_id)
                freed.add(node_id)
        for node_id, pool in enumerate(self.buffers):
            if pool.holds(request):
                pool.release(request)
                freed.add(node_id)
        for wait in self._landing_wait:
            if request in wait:
                wait.remove(request)
        if request.pe_engine is not None and not request.is_prefilled:
            pe = self._pe[request.pe_engine]
            if pe.node_id not in self.down:
                if request in pe.ready:
                    pe.ready.remove(request)
                pe.finish(request)
                self._note_compute_tok(self.pe_node(pe.node_id))
        self._release_de(request)
        for node_id in sorted(freed - self.down):
            self._admit(node_id, out)

    def _release_de(self, request: Request) -> None:
        """Give back a placed request's DE HBM reservation (on a DE that is up and not decoding it)."""
        if request.de_engine is None or request.phase in (Phase.DECODING, Phase.DONE):
            return
        e = self.de_engine(request.de_engine)
        if e.node_id in self.down:
            return
        node = self.de_node(e.node_id)
        if request in node.joining:
            return  # joined the batch's books (a decode run): its DE ends it instead
        node.release(e, request.total_tokens)
        e.seq -= 1
        self._de_freed(e.node_id)

    def _requeue(self, request: Request) -> None:
        request.de_engine = request.pe_engine = None
        request.pe_read_tokens = request.de_read_tokens = 0
        self.scheduler.submit(request)

    def _reset_node(self, node_id: int) -> None:
        """Fresh books for a node that went down or came back (what it held is gone with it)."""
        g = self.config.engines_per_node
        self.readers[node_id] = StorageReader(node_id, max_inflight_reads=self.config.max_inflight_reads)
        self.buffers[node_id] = CapacityPool(self.config.dram_buffer_bytes, name=f"node{node_id}/dram_buffer")
        if node_id in self.pe_nodes:
            node = PrefillNode(node_id, [PrefillEngine(node_id * g + i, node_id) for i in range(g)])
            self.pe_nodes[node_id] = self._pe_node_at[node_id] = node
            for e in node.engines:
                self._pe[e.engine_id] = e
            self._note_compute_tok(node)
        else:
            self.de_nodes[node_id] = self._de_node_at[node_id - self._num_pe_nodes] = DecodeNode(
                node_id,
                [DecodeEngine(node_id * g + i, node_id, self.config.de_hbm_kv_tokens) for i in range(g)],
                block_tokens=self.config.scheduler.block_tokens,
            )
            self._landing_wait[node_id] = Fifo()

    # ---- inspection ----------------------------------------------------------------------------
    @property
    def active_requests(self) -> int:
        return len(self._active)

    def view(self, request_id: int) -> RequestView | None:
        """A copy of the request's state now (None once the core has forgotten it)."""
        request = self._active.get(request_id)
        return None if request is None else RequestView(request)

    def decode_joiners(self, node_id: int) -> tuple[RequestView, ...]:
        """The requests that the DE node's next `start_decode_run` merges into its batch, as they are now."""
        return tuple(RequestView(r) for r in self.de_node(node_id).joining)

    def decode_batch(self, node_id: int) -> tuple[int, ...]:
        """Ids of the requests in the DE node's continuous batch, in the order they joined it."""
        return self.de_node(node_id).batch_ids()

    def check_invariants(self) -> None:
        for reader in self.readers:
            reader.check_invariants()
        for pool in self.buffers:
            pool.check_invariants()
        for node in self.de_nodes.values():
            if node.node_id not in self.down:
                node.check_invariants()
        for pe in self._pe:
            assert pe.seq >= 0 and pe.tok >= 0 and pe.compute_tok >= 0 and len(pe.ready) <= pe.seq
        # The lists by id hold the dicts' nodes (a reset node replaced in both).
        assert all(self.pe_node(n) is node for n, node in self.pe_nodes.items())
        assert all(self.de_node(n) is node for n, node in self.de_nodes.items())
        assert self._pe_open == {n for n, node in self.pe_nodes.items() if not self._all_over_beta(node)}
        assert self._pe_open_ids == sorted(self._pe_open)
        assert self.scheduler.waiting == self.scheduler.waiting_recount()
        if self.mode.scheduling != "round-robin":
            self.scheduler.check_de_views(
                {
                    n: (self.readers[n].read_q_tokens, node.reserved_tokens)
                    for n, node in self.de_nodes.items()
                    if n not in self.down
                }
            )
        if self.mode.skip_io:
            assert all(pool.used == 0 for pool in self.buffers)
