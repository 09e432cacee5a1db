"""The central request scheduler (paper §6.1–§6.3), fed by engine-group fetches.

NOTE: order of decisions. A request is placed on a DE first (two-phase, §6.2), then on a PE by
Algorithm 1 (§6.1), and at that moment, with both nodes known, its read side is chosen (§6.3):

    submit ─► global queue ─DE fetch─► DE group queue ─DE fetch─► PE queue Q ─PE fetch─► Assignment
                          (phase 1)                  (phase 2: HBM reserved)   (Alg. 1 + read path)

DE first because a DE admits a request only if its HBM can hold it (§6.2); placing the PE first
could start a prefill whose KV has nowhere to go. The read side needs both nodes' read queues, so it
comes last. Algorithm 1 and the two-phase DE rule run unchanged; only the queue they read differs.

`scheduling="round-robin"` is the baseline (modes basic, layerwise, dualpath-rr): DEs and PEs in
turn over the whole cluster, load-agnostic, still respecting DE HBM so decode never preempts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dualpath.config.specs import SchedulerSpec
from dualpath.policy.de_assign import DeCandidate, GroupTokens, assign_within_de_group, route_to_de_groups
from dualpath.policy.decisions import Assignment, DecisionLog
from dualpath.policy.fifo import Fifo
from dualpath.policy.pe_assign import PeCandidate, choose_prefill_engine
from dualpath.policy.read_path import ReadPathPolicy
from dualpath.policy.types import EngineLoad, NodeReadState
from dualpath.request import Phase, Request

SCHEDULINGS = ("dualpath", "round-robin")


class NodeSet:
    """A set of node ids (small ints >= 0, below `size`): add, discard and membership by a flag per id,
    its members listed in id order (`in_order`).

    NOTE: the DE groups due a visit are marked at most changes of the cluster and listed at every
    fetch; a `set[int]` boxes each id it is given and, listed, walks every slot of its table, which
    keeps the size of its fullest moment (96 DE groups at 48P96D: 2 % of that run in iterating them,
    benchmarks/README.md). Here a member is also in `_listed` (once: `_on_list`); ids that left stay
    there until the next listing drops them.
    """

    __slots__ = ("_member", "_on_list", "_listed")

    def __init__(self, size: int) -> None:
        self._member = [False] * size
        self._on_list = [False] * size
        self._listed: list[int] = []

    def __contains__(self, node_id: int) -> bool:
        return self._member[node_id]

    def add(self, node_id: int) -> None:
        self._member[node_id] = True
        if not self._on_list[node_id]:
            self._on_list[node_id] = True
            self._listed.append(node_id)

    def discard(self, node_id: int) -> None:
        self._member[node_id] = False

    def in_order(self) -> list[int]:
        """The members, in increasing id order."""
        member, on_list = self._member, self._on_list
        kept: list[int] = []
        for node_id in self._listed:
            if member[node_id]:
                kept.append(node_id)
            else:
                on_list[node_id] = False
        kept.sort()
        self._listed = kept[:]
        return kept


class RequestScheduler:
    def __init__(
        self,
        *,
        pe_nodes: Mapping[int, Sequence[int]],
        de_nodes: Mapping[int, Sequence[int]],
        spec: SchedulerSpec,
        read_path: ReadPathPolicy,
        read_tokens_per_s: Mapping[int, float],
        alpha_tokens: float,
        beta_tokens: float,
        scheduling: str = "dualpath",
        log: DecisionLog | None = None,
    ) -> None:
        if scheduling not in SCHEDULINGS:
            raise ValueError(f"unknown scheduling {scheduling!r} (known: {', '.join(SCHEDULINGS)})")
        self.spec = spec
        # Read per fetch and per placement: plain fields, not lookups on the (interpreted) spec.
        self._block_tokens = spec.block_tokens
        self._de_token_threshold_factor = spec.de_token_threshold_factor
        self.read_path = read_path
        self.scheduling = scheduling
        self.alpha_tokens = alpha_tokens
        self.beta_tokens = beta_tokens
        self.log = log if log is not None else DecisionLog()
        self._pe_nodes = {n: tuple(e) for n, e in sorted(pe_nodes.items())}
        self._de_nodes = {n: tuple(e) for n, e in sorted(de_nodes.items())}
        # Every engine in node order: the round-robin cycles. Built once, not per fetch (1,152 engines at
        # 48P96D).
        self._pe_engines = tuple(e for es in self._pe_nodes.values() for e in es)
        self._de_engines = tuple(e for es in self._de_nodes.values() for e in es)
        # Per engine and per node in lists indexed by id (ids are small non-negative ints; -1 / 0 where
        # an id is no engine or node): read on every placement, where a dict hashes a boxed key.
        node_ids = [n for nodes in (self._pe_nodes, self._de_nodes) for n in nodes]
        engine_ids = [*self._pe_engines, *self._de_engines]
        if min(node_ids + engine_ids, default=0) < 0:
            raise ValueError("node and engine ids must be >= 0")
        self._node_of = [-1] * (max(engine_ids, default=-1) + 1)
        for nodes in (self._pe_nodes, self._de_nodes):
            for n, es in nodes.items():
                for e in es:
                    self._node_of[e] = n
        missing = [n for n in node_ids if n not in read_tokens_per_s]
        if missing:
            raise ValueError(f"no read rate for nodes {missing}")
        num_nodes = max(node_ids, default=-1) + 1
        self._read_rate = [0.0] * num_nodes
        for n in node_ids:
            self._read_rate[n] = read_tokens_per_s[n]
        self._read_q = [0] * num_nodes  # last report + our own assignments
        # Each group's candidates, one object per engine, rewritten from its reports at each fetch
        # (`_pe_candidates`, `_de_candidates`): used during the fetch only, not built anew each time.
        self._pe_cands: list[list[PeCandidate] | None] = [None] * num_nodes  # by node id
        self._de_cands: list[list[DeCandidate] | None] = [None] * num_nodes
        # Σ tok per DE group, last report + routed, with phase 1's next group at hand (`GroupTokens`).
        self._group_tok = GroupTokens(list(self._de_nodes))
        self._global: Fifo[Request] = Fifo()
        # Each DE group's private queue at its node id (None: no DE node), read by id at every fetch and
        # report (`_de_queue`): a list index, where a dict hashed the id.
        self._de_queues: list[Fifo[Request] | None] = [None] * num_nodes
        for n in self._de_nodes:
            self._de_queues[n] = Fifo()
        # Σ of the DE group queues' lengths: `waiting` runs on every driver poke, and a sum over the
        # queues would cost O(DE groups) each time (96 at 48P96D).
        self._de_queued = 0
        self._pe_queue: Fifo[Request] = Fifo()
        self._rr_de = 0
        # Round robin: turns lost in a row since the head of the global queue or any DE's free HBM last
        # changed. A whole cycle of them means no DE has room for the head until one frees
        # (`has_de_work`), so every fetch until then would lose the same turns and end where it began.
        self._rr_lost_turns = 0
        # DE groups whose private queue could move at their next fetch (`has_de_work`): routed to since
        # their last fetch, or one of their DEs freed since. A fetch leaves its group out of it: phase 2
        # is deterministic, so an unchanged queue stops at the same head again.
        self._de_pending = NodeSet(num_nodes)
        # Speed only, same decisions (`de_groups_to_visit`): DE groups whose read queue or Σtok may differ
        # from what `_read_q` / `_group_tok` hold (marked wherever either side changes), so their report
        # would write something new.
        self._de_report_due = NodeSet(num_nodes)
        self._is_de_node = [False] * num_nodes
        for n in self._de_nodes:
            self._is_de_node[n] = True
        self._rr_pe = 0
        # Nodes that died (`ClusterCore.on_node_down`): round robin skips them.
        self.down_nodes: set[int] = set()

    # ---- intake -------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        request.phase = Phase.QUEUED
        if not self._global:
            self._rr_lost_turns = 0  # a new head: the lost turns were lost to another request
        self._global.append(request)

    def remove(self, request_id: int) -> Request | None:
        """Take a waiting request out of whichever queue holds it (a cancel, or a node that went down:
        `ClusterCore.on_node_down`); None if none does. O(queue length): rare events only."""
        private_queues = [q for q in self._de_queues if q is not None]
        for queue in (self._global, self._pe_queue, *private_queues):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    break
            else:
                continue
            for node_id, private in enumerate(self._de_queues):
                if private is queue:
                    self._de_queued -= 1
                    self._de_report_due.add(node_id)  # its Σtok view counted the request
                    if not private:
                        self._de_pending.discard(node_id)
            return request
        return None

    @property
    def waiting(self) -> int:
        return len(self._global) + self._de_queued + len(self._pe_queue)

    def check_de_views(self, reports: Mapping[int, tuple[int, int]]) -> None:
        """Every pending DE group has a queue, and every DE group not due for a report holds its report
        already; `reports`: node -> (read_q_tokens, Σ tok_e) now (two-phase scheduling)."""
        assert all(self._de_queue(n) for n in self._de_pending.in_order()), self._de_pending.in_order()
        for node_id, (read_q_tokens, tok) in reports.items():
            if node_id not in self._de_report_due:
                assert self._read_q[node_id] == read_q_tokens, (node_id, self._read_q[node_id], read_q_tokens)
                assert self._group_tok[node_id] == tok, (node_id, self._group_tok[node_id], tok)

    def waiting_recount(self) -> int:
        """`waiting` counted from the queues themselves (checks the running count)."""
        de_queued = sum(len(q) for q in self._de_queues if q is not None)
        return len(self._global) + de_queued + len(self._pe_queue)

    @property
    def pe_queue_len(self) -> int:
        return len(self._pe_queue)

    def node_of(self, engine_id: int) -> int:
        node = self._node_of[engine_id] if 0 <= engine_id < len(self._node_of) else -1
        if node < 0:
            raise KeyError(engine_id)
        return node

    def has_de_work(self, node_id: int, max_free_hbm_tokens: int) -> bool:
        """Whether a fetch by this DE group could place anything (else it only reports its load).

        False when the global queue is empty and the group's private queue is empty or unchanged
        since the group's last fetch with no DE of the group freed since (`note_de_freed`): phase 2
        is deterministic, so it would stop at the same head again. False too when no DE of the group
        has room for the head (`max_free_hbm_tokens`: the most free HBM on one of its DEs): phase 2
        would stop at the head at once. Round robin: False also once every DE has lost a turn in a row
        to the same head with no DE freed since (`_rr_lost_turns`).
        """
        if self.scheduling == "round-robin":
            return bool(self._global) and self._rr_lost_turns < len(self._de_engines)
        if self._global:
            return True
        if node_id not in self._de_pending:
            return False
        return self._de_queue(node_id).peek().total_tokens <= max_free_hbm_tokens

    def note_de_freed(self, node_id: int) -> None:
        """A request on this DE group finished or shrank: its HBM and tok_e fell, so its queue may move
        (every release of DE HBM calls this)."""
        self._rr_lost_turns = 0
        if self._de_queue(node_id):
            self._de_pending.add(node_id)
        self._de_report_due.add(node_id)

    def mark_de_report_due(self, node_id: int) -> None:
        """The node's read queue or its DEs' Σtok changed (a no-op for a PE node): report it next fetch."""
        if 0 <= node_id < len(self._is_de_node) and self._is_de_node[node_id]:
            self._de_report_due.add(node_id)

    @property
    def global_queue_len(self) -> int:
        return len(self._global)

    def de_groups_to_visit(self, *, after: int) -> list[int]:
        """DE groups with ids above `after` whose fetch could place something or change a report, in id
        order; for every other group a fetch would report what the scheduler already holds and place
        nothing (with the global queue empty), so a leader loop may skip them (speed only)."""
        due = self._de_report_due
        visit = [n for n in due.in_order() if n > after]
        pending = [n for n in self._de_pending.in_order() if n > after and n not in due]
        if pending:  # a pending group not due a report (rare): merged in, in id order
            visit += pending
            visit.sort()
        return visit

    def note_de_group(self, node_id: int, *, read_q_tokens: int, tok: int) -> None:
        """A DE group's report (its node's read queue, its Σ tok_e) from a fetch that places nothing.

        Like such a fetch, it leaves the group out of the pending ones (`has_de_work`) until one of its
        DEs frees or a request is routed to it."""
        self._read_q[node_id] = read_q_tokens
        if self.scheduling != "round-robin":
            self._group_tok[node_id] = tok
        self._de_report_due.discard(node_id)
        self._de_pending.discard(node_id)

    def _note(self, loads: list[EngineLoad]) -> None:
        # A group's engines share their node's queue, so its reports repeat one (node, queue) pair:
        # writing that pair again changes nothing, and costs a boxed key and value and a dict store each.
        node_id, read_q_tokens = -1, -1
        for load in loads:
            if load.node_id != node_id or load.read_q_tokens != read_q_tokens:
                node_id, read_q_tokens = load.node_id, load.read_q_tokens
                self._read_q[node_id] = read_q_tokens

    # ---- DE fetch (§6.2) ----------------------------------------------------------------------
    def fetch_de_group(self, node_id: int, loads: list[EngineLoad]) -> list[tuple[Request, int]]:
        """A DE group's leader fetches: returns [(request, de_engine)]; those requests join Q."""
        self._note(loads)
        if self.scheduling == "round-robin":
            placed = self._round_robin_de(loads)
        else:
            group_tok = 0
            for load in loads:  # a loop, not sum() over a generator: no iterator objects per fetch
                group_tok += load.tok
            self._group_tok[node_id] = group_tok
            self._de_report_due.discard(node_id)  # its view is its report now (routing may change it)
            # Phase 1 adds each routed request's len_r to its group's Σtok.
            routed = route_to_de_groups(self._global.to_list(), self._group_tok) if self._global else []
            for rid, group in routed:
                request = self._global.popleft()
                assert request.request_id == rid
                self._de_queue(group).append(request)
                self._de_queued += 1
                self._de_pending.add(group)
                self._de_report_due.add(group)
            queue = self._de_queue(node_id)
            # An empty private queue places nothing (phase 2 would return []): skip the candidates.
            cands = self._de_candidates(node_id, loads) if queue else []
            z_factor = self._de_token_threshold_factor
            placed = []
            for _rid, engine in assign_within_de_group(queue, cands, z_factor=z_factor):
                placed.append((queue.popleft(), engine))
                self._de_queued -= 1
            self._de_pending.discard(node_id)
        for request, engine in placed:
            request.de_engine = engine
            self._pe_queue.append(request)
        return placed

    def _de_queue(self, node_id: int) -> Fifo[Request]:
        """The DE group's private queue (KeyError for a node id that is no DE group's)."""
        queue = self._de_queues[node_id] if 0 <= node_id < len(self._de_queues) else None
        if queue is None:
            raise KeyError(f"node {node_id} is not a DE node")
        return queue

    def _de_candidates(self, node_id: int, loads: list[EngineLoad]) -> list[DeCandidate]:
        """The group's DE candidates, every field set from its reports."""
        cands = self._de_cands[node_id]
        if cands is None or len(cands) != len(loads):
            cands = self._de_cands[node_id] = [
                DeCandidate(engine_id=-1, node_id=-1, seq=0, tok=0, free_hbm_tokens=0) for _ in loads
            ]
        for i in range(len(loads)):
            x, c = loads[i], cands[i]
            c.engine_id = x.engine_id
            c.node_id = x.node_id
            c.seq = x.seq
            c.tok = x.tok
            c.free_hbm_tokens = x.free_hbm_tokens
        return cands

    def _pe_candidates(self, node_id: int, loads: list[EngineLoad]) -> list[PeCandidate]:
        """The group's PE candidates, every field set from its reports."""
        cands = self._pe_cands[node_id]
        if cands is None or len(cands) != len(loads):
            cands = self._pe_cands[node_id] = [
                PeCandidate(engine_id=-1, node_id=-1, tok=0, compute_tok=0, read_q_tokens=0) for _ in loads
            ]
        for i in range(len(loads)):
            x, c = loads[i], cands[i]
            c.engine_id = x.engine_id
            c.node_id = x.node_id
            c.tok = x.tok
            c.compute_tok = x.compute_tok
            c.read_q_tokens = x.read_q_tokens
        return cands

    def _round_robin_de(self, loads: list[EngineLoad]) -> list[tuple[Request, int]]:
        """Baseline: the global queue's head to the next DE of a cluster-wide cycle.

        A group knows only its own engines' HBM, so it takes the turns of its engines and stops when
        the cycle reaches another group's engine (that group takes them at its fetch). An engine
        without room loses its turn, so a full DE never blocks the cycle.

        A whole cycle of lost turns in a row (counted across fetches, `_rr_lost_turns`) ends the fetch:
        until the head changes or a DE frees, every further cycle would lose the same turns (with one
        DE group the loop would never end), and the cycle position is back where it started.
        """
        free = {x.engine_id: x.free_hbm_tokens for x in loads}
        engines = self._de_engines
        placed: list[tuple[Request, int]] = []
        while self._global and self._rr_lost_turns < len(engines):
            engine = engines[self._rr_de % len(engines)]
            if engine not in free:
                break  # another group's turn: it takes it at its own fetch
            self._rr_de += 1
            if free[engine] >= self._global.peek().total_tokens:  # no room: this engine loses its turn
                free[engine] -= self._global.peek().total_tokens
                placed.append((self._global.popleft(), engine))
                self._rr_lost_turns = 0
            else:
                self._rr_lost_turns += 1
        return placed

    # ---- PE fetch (§6.1, §6.3) ----------------------------------------------------------------
    def fetch_pe_group(self, node_id: int, loads: list[EngineLoad]) -> list[Assignment]:
        """A PE group's leader fetches: Algorithm 1 over Q on this group's engines, then read sides.

        Round-robin scheduling instead deals all of Q to PEs cluster-wide in turn (no β).
        """
        self._note(loads)
        cands = self._pe_candidates(node_id, loads)
        engines = self._pe_engines
        out: list[Assignment] = []
        while self._pe_queue:
            request = self._pe_queue.peek()
            if self.scheduling == "round-robin":
                pe_engine = engines[self._rr_pe % len(engines)]
                self._rr_pe += 1
                for _ in range(len(engines) - 1):  # a dead node's engines lose their turns
                    if self._node_of[pe_engine] not in self.down_nodes:
                        break
                    pe_engine = engines[self._rr_pe % len(engines)]
                    self._rr_pe += 1
            else:
                # Read queues may have grown by earlier assignments this fetch: each node's looked up once.
                cand_node, read_q = -1, 0
                for cand in cands:
                    if cand.node_id != cand_node:
                        cand_node = cand.node_id
                        read_q = self._read_q[cand_node]
                    cand.read_q_tokens = read_q
                pe = choose_prefill_engine(
                    cands, alpha_tokens=self.alpha_tokens, beta_tokens=self.beta_tokens
                )
                if pe is None:
                    break  # C2 and C3 empty: hand what we have to the leader (Alg. 1)
                pe.take(request)
                pe_engine = pe.engine_id
            self._pe_queue.popleft()
            out.append(self._place(request, pe_engine))
        return out

    def _place(self, request: Request, pe_engine: int) -> Assignment:
        assert request.de_engine is not None
        pe_node, de_node = self._node_of[pe_engine], self._node_of[request.de_engine]
        plan = self.read_path.plan(
            request.hit_tokens,
            pe_node=NodeReadState(
                read_q_tokens=self._read_q[pe_node], read_tokens_per_s=self._read_rate[pe_node]
            ),
            de_node=NodeReadState(
                read_q_tokens=self._read_q[de_node], read_tokens_per_s=self._read_rate[de_node]
            ),
            block_tokens=self._block_tokens,
        )
        self._read_q[pe_node] += plan.pe_read_tokens
        self._read_q[de_node] += plan.de_read_tokens
        self._de_report_due.add(de_node)
        request.pe_engine = pe_engine
        request.pe_read_tokens = plan.pe_read_tokens
        request.de_read_tokens = plan.de_read_tokens
        request.phase = Phase.ASSIGNED
        assignment = Assignment(
            request_id=request.request_id,
            pe_engine=pe_engine,
            de_engine=request.de_engine,
            pe_read_tokens=plan.pe_read_tokens,
            de_read_tokens=plan.de_read_tokens,
        )
        self.log.record(assignment)
        return assignment
