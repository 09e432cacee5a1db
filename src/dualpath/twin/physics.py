"""What the CPU runtime pays that a GPU cluster does not: the simulator's physics, extended for the twin.

`TwinSimulation` is the simulator (`sim.driver.Simulation`, same core, same links) with the runtime's own
costs added, each from a calibration measurement (docs/twin.md "What the twin adds"):

- Shared cores (`host_cpu.HostCpu`): every engine is one Python process computing on one torch thread,
  and the host has `cpu_count` cores. Every piece of CPU our processes spend is work on one of our
  threads (a forward on the PE's, a decode run on the DE's, messages and chunks on the scheduler's, a
  request's client side on the client's), shared by processor sharing with the cores other jobs left
  (`external_cores`, measured by `host_load.HostLoadSampler` outside our process tree) and with a
  background of our own threads that work all the time; CPU seconds are conserved. What each piece
  costs is its calibrated CPU time (one thread on an idle core) times the in-situ factor of its group
  (`calibration_runtime`, measured on training replays of a running cluster). An engine's piece (a
  forward, a decode run) keeps its thread only η busy (`pe_efficiency`, `de_efficiency`, in situ: the
  runtime's wall ÷ CPU per piece beyond what the sharing explains — the GIL, wake-ups).
- HTTP legs: a round's POST and its first SSE chunk back (`http_leg_s` + per prompt token, measured on
  the real API app with a no-op backend) delay the request's arrival at the scheduler; TTFT counts from
  the client's send.
- Control round trips: a PE forward pays one message from the scheduler and one completion back
  (`control_round_trip_s`), its embedding + LM head (`prefill_head_s`, which the cost model's layer
  terms do not include) and its Python work beyond the layers (`prefill_python_s` + per item + per
  cached row). Between a DE's decode runs (up to `max_decode_run_steps` steps, one message each), and
  before a forward's compute starts, the in-situ `decode_restart_s` (else the idle round trip): the
  same trip from the scheduler to a node's engine thread and back. A first token and a `done` reach the
  client that much later too (node -> scheduler -> client).
- Store writes: the runtime's `PipelinedWriter` paces blocks on the SNIC back to back while a small
  pool commits them (`store_write_op_s` each): a persist is done one commit after its last byte. Its
  jobs (one per persist command, prompt blocks or decode-time blocks) cross the link FIFO per DE node,
  so the first request of a batch is durable long before the last (`_FifoWriter`); the simulator's
  write pipe sends what queued together and finishes it together.
- Oracle store writes: with I/O skipped, the DE's writer commits every block that became whole
  (runtime/de_executor.py `_persist_inline`); a request's last decode step waits for its writes, and a
  one-token request's `done` waits for its prompt blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dualpath.engine import commands as cmd
from dualpath.runtime.driver import DriverConfig
from dualpath.runtime.loadgen import poisson_starts
from dualpath.runtime.persist import COMMITS_IN_FLIGHT
from dualpath.sim.agents import Round
from dualpath.sim.driver import SimConfig, Simulation, StepCosts
from dualpath.sim.links import TrafficClass
from dualpath.twin.calibration import NO_FACTORS, CalibrationOverheads
from dualpath.twin.host_cpu import CpuWork, HostCpu

# A quarter core: what our processes keep even when other jobs used (nearly) every core.
_MIN_CAPACITY_CORES = 0.25
# The runtime driver's default run length (runtime/driver.py DriverConfig.max_decode_run_steps).
_DEFAULT_DECODE_RUN_STEPS = int(DriverConfig.__dataclass_fields__["max_decode_run_steps"].default)  # type: ignore[arg-type]


class _RuntimeCost:
    """The calibrated cost model as the runtime's processes experience it (shared cores, fixed costs)."""

    def __init__(self, base: StepCosts, twin: TwinSimulation) -> None:
        self._base, self._twin = base, twin

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def prefill_step_s(
        self, per_gpu_batches: Sequence[Sequence[Any]], layer_index: int
    ) -> tuple[float, float, list[float]]:
        """The simulator's one-pass step cost (`CostModel.prefill_step_s`) with the runtime's terms, in CPU
        seconds: the twin runs a forward as CPU work on the PE's thread (`TwinSimulation._submit_forward`)."""
        forward_s, layer_s, attention = self._base.prefill_step_s(per_gpu_batches, layer_index)
        factor = self._twin.cpu_factors["pe_engine"]
        return (forward_s + self._twin.forward_fixed_s(per_gpu_batches)) * factor, layer_s * factor, attention

    def decode_step_max_s(self, shape: Sequence[tuple[int, int]]) -> float:
        # CPU seconds: a decode run is CPU work on the DE's thread (`TwinSimulation._decode_start`).
        return float(self._base.decode_step_max_s(shape)) * self._twin.cpu_factors["de_engine"]


class _FifoWriter:
    """runtime/persist.py `PipelinedWriter`'s pacing thread: one job's bytes at a time, in arrival order."""

    __slots__ = ("net", "then", "busy", "queue")

    def __init__(self, net: Any, then: Any) -> None:
        self.net, self.then = net, then
        self.busy = False
        self.queue: deque[tuple[float, tuple[int, bool, int], tuple[Any, ...]]] = deque()

    def put(self, size_bytes: float, item: tuple[int, bool, int], path: tuple[Any, ...]) -> None:
        self.queue.append((size_bytes, item, path))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        size_bytes, item, path = self.queue.popleft()
        self.busy = True
        self.net.start_flow(size_bytes, path, TrafficClass.LOW, self._done, item, size_bytes)

    def _done(self, item: tuple[int, bool, int], size_bytes: float) -> None:
        self.busy = False
        if self.queue:
            self._next()  # the link never waits for a commit (the commit pool runs beside it)
        self.then([item], size_bytes)


class TwinSimulation(Simulation):
    def __init__(
        self,
        config: SimConfig,
        trajectories: Sequence[Sequence[Round]],
        *,
        seed: int,
        overheads: CalibrationOverheads,
        host_cores: float,
        external_cores: float = 0.0,
        cpu_factors: Mapping[str, float] | None = None,
    ) -> None:
        self._seed = seed  # read by _arrivals during the base constructor
        self._sent_s: dict[int, float] = {}  # agent -> when its client sent the round now in flight
        super().__init__(config, trajectories, seed=seed)
        self.overheads = overheads
        # Other jobs' CPU is capacity we do not get; a floor keeps a saturated host finite.
        self.capacity_cores = max(_MIN_CAPACITY_CORES, host_cores - external_cores)
        # In-situ factors per thread group (twin/calibration_runtime.py); `NO_FACTORS` where not measured.
        given = cpu_factors or {}
        self.cpu_factors = {**NO_FACTORS, **{g: float(v) for g, v in given.items() if g in NO_FACTORS}}
        self.host_cpu = HostCpu(
            self.sim, self.capacity_cores, background=self.cpu_factors["background_cores"]
        )
        # A command's trip to a node's engine thread on busy cores (scheduler -> node main loop -> engine
        # thread, and the completion back): the in-situ wait between a DE's decode runs, where measured,
        # else the idle round trip. Charged between a DE's runs and before every forward's compute.
        self.decode_restart_s = float(given.get("decode_restart_s", overheads.control_round_trip_s))
        # Per PE node, its forward now: (CPU work done, loads done) — a layerwise forward ends when both are.
        self._forward_state: dict[int, list[bool]] = {}
        self._decode_work: dict[int, CpuWork] = {}  # per DE node: its running decode run's CPU work
        self.cost = _RuntimeCost(self.cost, self)
        self.max_decode_run_steps = _DEFAULT_DECODE_RUN_STEPS
        self._stall_s: dict[int, float] = {}
        self._stalled: set[int] = set()
        self._written: set[int] = set()  # oracle joiners whose prompt blocks are queued
        self._writer_free_s: dict[int, list[float]] = {}  # oracle: per DE node, when each commit slot is free
        self._fifo_writers: dict[int, _FifoWriter] = {}  # per DE node: its PipelinedWriter's pacing queue
        # The engines' work pieces as the runtime's EngineWork counts them (a forward from the engine
        # thread taking it to its end; a decode run): [pieces, wall s, CPU s] per group.
        self.engine_work: dict[str, list[float]] = {"pe_engine": [0, 0.0, 0.0], "de_engine": [0, 0.0, 0.0]}
        self._forward_began: dict[int, float] = {}  # per PE node: when its engine thread took the step
        self._forward_work: dict[int, CpuWork] = {}
        self._run_began: dict[int, float] = {}

    def _arrivals(self, rng: np.random.Generator) -> None:
        """Agent starts exactly as the runtime's load generator draws them (`runtime.loadgen.poisson_starts`)."""
        starts = poisson_starts(len(self.agents), self.config.aps, np.random.default_rng([self._seed, 1]))
        for agent, start_s in zip(self.agents, starts, strict=True):
            agent.start_s = start_s
            self.sim.schedule_at(start_s, self._next_round, agent)

    # ---- shared cores (twin/host_cpu.py) ----------------------------------------------------------
    def cpu_share(self, *, starting: int) -> float:
        """Wall ÷ CPU time of work that starts now with `starting` more threads and keeps that share."""
        return 1.0 / self.host_cpu.rate(extra=starting)

    def _own_cpu(self, thread: str, cpu_s: float) -> None:
        """CPU work of our own non-engine threads: the scheduler/API loop ("serve") or the client."""
        if cpu_s > 0.0:
            self.host_cpu.submit(thread, cpu_s * self.cpu_factors.get(thread, 1.0))

    def _http_cpu(self, cpu_s: float) -> None:
        """A request's HTTP CPU, calibrated for server and client together: half on each thread."""
        self._own_cpu("serve", cpu_s / 2)
        self._own_cpu("client", cpu_s / 2)

    def _start_compute(self, step: Any) -> None:
        """Oracle forward: the hit's store read and the compute, as CPU on the PE's thread. (In oracle the
        node's links are unpaced, runtime/node.py `_UNPACED_BYTES_PER_S`: the cached rows' loopback over
        the CNIC costs no link time, only the copies, which the in-situ factor carries.)"""
        batches = [[(i.cached_tokens, i.new_tokens) for i in b] for b in step.c.batches]
        read_cpu_s = self.oracle_pe_read_s(batches) * self.cpu_factors["pe_engine"]
        self.sim.schedule(self.decode_restart_s, self._compute_on_pe, step, step.compute_s + read_cpu_s)

    def _compute_on_pe(self, step: Any, cpu_s: float) -> None:
        self._forward_work[step.c.node_id] = self.host_cpu.submit(
            f"pe{step.c.node_id}", cpu_s, lambda: self._compute_done(step),
            weight=self.cpu_factors["pe_efficiency"],
        )  # fmt: skip

    def forward_fixed_s(self, per_gpu_batches: Sequence[Sequence[Any]]) -> float:
        """A PE forward's CPU beyond its layers: head, Python work per forward and item, round trip."""
        o = self.overheads
        items = sum(len(b) for b in per_gpu_batches)
        cached = sum(c for b in per_gpu_batches for c, _ in b)
        python_s = (
            o.prefill_python_s
            + o.prefill_python_s_per_item * items
            + o.prefill_python_s_per_cached_token * cached
        )
        return o.prefill_head_s + python_s + o.control_round_trip_s

    def oracle_pe_read_s(self, per_gpu_batches: Sequence[Sequence[Any]]) -> float:
        """Oracle: the PE's worker reads each first chunk's hit from the store itself before computing
        (runtime/pe_executor.py `_resolve` -> `_read`, `inline_io`): one `store_read_op_s` per Full Block
        + bytes at the FileStore read rate (page-cache warm: CPU on the worker's thread). Items of later
        chunks are counted as first chunks (an over-count)."""
        if not self.mode.skip_io:
            return 0.0
        bt = self.cluster.scheduler.block_tokens
        cached = sum(c for batch in per_gpu_batches for c, _ in batch)
        blocks = sum(-(-c // bt) for batch in per_gpu_batches for c, _ in batch if c > 0)
        return (
            blocks * self.overheads.store_read_op_s
            + cached * self.kv_bytes / self.cluster.hardware.storage_bytes_per_s
        )

    # ---- the client's HTTP legs (calibration_http) --------------------------------------------------
    def _next_round(self, agent: Any) -> None:
        if agent.next_round >= len(agent.rounds):
            super()._next_round(agent)  # the agent is done: its JCT ends with its last done
            return
        o = self.overheads
        prompt = agent.context_tokens + agent.rounds[agent.next_round][0]
        self._sent_s[agent.agent_id] = self.sim.now_s
        self._http_cpu(o.http_cpu_s + o.http_cpu_s_per_prompt_token * prompt)
        leg_s = (o.http_leg_s + o.http_leg_s_per_prompt_token * prompt) * self.cpu_share(starting=1)
        if leg_s > 0.0:
            self.sim.schedule(leg_s, self._arrive, agent)
        else:
            self._arrive(agent)

    def _arrive(self, agent: Any) -> None:
        request_id = self._next_id
        super()._next_round(agent)
        if request_id in self.times:  # TTFT counts from the client's send, as the load generator's
            self.times[request_id].arrival_s = self._sent_s.pop(agent.agent_id)

    def _start_step(self, c: cmd.StartPrefillStep) -> None:
        # The scheduler's step message and the node's completion; each item's first token streamed.
        items = sum(len(b) for b in c.batches)
        self._own_cpu("serve", 2 * self.overheads.control_cpu_s + items * self.overheads.sse_chunk_cpu_s)
        self._forward_state[c.node_id] = [False, False]
        # The runtime's engine thread takes the step after the command's trip, then loads and computes.
        self._forward_began[c.node_id] = self.sim.now_s + self.decode_restart_s
        # Oracle: `_start_compute`; else the loads start, and `_loads_finished` runs at once if none.
        super()._start_step(c)
        step = self._steps[c.node_id]
        if c.layerwise and not self.mode.skip_io:  # layer i computes as its load lands: from the start
            self._submit_forward(step)

    def _submit_forward(self, step: Any) -> None:
        """The forward's CPU on the PE's thread, once the step command reached it (`decode_restart_s`)."""
        self.sim.schedule(self.decode_restart_s, self._forward_on_pe, step)

    def _forward_on_pe(self, step: Any) -> None:
        self._forward_work[step.c.node_id] = self.host_cpu.submit(
            f"pe{step.c.node_id}", step.compute_s, lambda: self._forward_computed(step),
            weight=self.cpu_factors["pe_efficiency"],
        )  # fmt: skip

    def _compute_done(self, step: Any) -> None:
        node = step.c.node_id
        began_s, work = self._forward_began.pop(node, None), self._forward_work.pop(node, None)
        if began_s is not None and work is not None:
            self._count_piece("pe_engine", self.sim.now_s - began_s, work.total_cpu_s)
        super()._compute_done(step)

    def _count_piece(self, group: str, wall_s: float, cpu_s: float) -> None:
        counts = self.engine_work[group]
        counts[0] += 1
        counts[1] += wall_s
        counts[2] += cpu_s

    def _forward_computed(self, step: Any) -> None:
        state = self._forward_state[step.c.node_id]
        state[0] = True
        if state[1] or not step.c.layerwise:
            self._compute_done(step)

    def _loads_finished(self, step: Any) -> None:
        """Whole KV (Basic): the forward's CPU starts now. Layerwise: its CPU started with the step; once
        it is done, the last layer still waits for its load, then computes (`engine.pipeline`'s form)."""
        state = self._forward_state[step.c.node_id]
        state[1] = True
        if not step.c.layerwise:
            self._submit_forward(step)
        elif state[0]:
            self.sim.schedule(step.last_layer_s / self.host_cpu.rate(extra=1), self._compute_done, step)

    # ---- store writes ----------------------------------------------------------------------------
    # runtime/persist.py `PipelinedWriter` (runtime 9637f57): one thread paces the blocks on the SNIC
    # back to back while a pool of COMMITS_IN_FLIGHT commits them (FileStore: write, fsync, rename,
    # store_write_op_s each), so the link never waits for a commit and a write is durable one commit
    # after its last byte crossed. (A commit longer than COMMITS_IN_FLIGHT blocks' link time would back
    # up the pool; at the calibrated 1-15 ms against ~11 ms per 64 KiB block at 6 MB/s it does not.)
    def _persist(self, c: cmd.StartPersist) -> None:
        """One job on the DE node's FIFO writer, sent when the command arrives (runtime `_do_persist`)."""
        de = c.de_engine
        node = self.core.node_of_engine(de)
        writer = self._fifo_writers.get(node)
        if writer is None:
            writer = self._fifo_writers[node] = _FifoWriter(self.net, self._persisted)
        # Decode-time blocks are copied out of the cache (the D2H) and then cross the same SNIC.
        path = self.topo.d2h(de) + self.topo.persist(de)[1:] if c.from_hbm else self.topo.persist(de)
        writer.put(c.tokens * self.kv_bytes, (c.request.request_id, c.from_hbm, de), path)

    def _persisted(self, items: list[tuple[int, bool, int]], size: float) -> None:
        self.sim.schedule(self.overheads.store_write_op_s, super()._persisted, items, size)

    # ---- oracle: the DE writes whole blocks beside its decode loop ----------------------------------
    # runtime/de_executor.py `_persist_inline`: with I/O skipped there are no persist commands; every
    # block that becomes whole (a joiner's prompt blocks beyond its hit at its first step, then one per
    # block_tokens generated) goes to the DE's PipelinedWriter (unpaced link, COMMITS_IN_FLIGHT commits
    # of store_write_op_s at a time), and a request's last decode step waits until its writes landed.
    # A request with no decode step (one generated token) has its prompt blocks written at release,
    # and the client hears `done` only once they landed (runtime/driver.py `_done`, 9637f57).
    def _enqueue_writes(self, node: int, blocks: int) -> float:
        """Queue `blocks` commits on the DE's commit pool; returns when the last one lands."""
        free = self._writer_free_s.setdefault(node, [0.0] * COMMITS_IN_FLIGHT)
        landed_s = self.sim.now_s
        for _ in range(blocks):
            slot = min(range(len(free)), key=free.__getitem__)
            free[slot] = max(free[slot], self.sim.now_s) + self.overheads.store_write_op_s
            landed_s = max(landed_s, free[slot])
        return landed_s

    def _oracle_joins(self, node: int) -> None:
        bt = self.cluster.scheduler.block_tokens
        for r in self.core.de_nodes[node].joining:
            if r.request_id not in self._written:
                self._written.add(r.request_id)
                self._enqueue_writes(node, max(0, (r.prompt_tokens + 1) // bt - r.hit_tokens // bt))

    def _done(self, c: cmd.RequestDone) -> None:
        r = c.request
        if self.mode.skip_io and r.de_engine is not None:
            bt = self.cluster.scheduler.block_tokens
            node = self.core.node_of_engine(r.de_engine)
            if r.request_id not in self._written:  # no decode step: prompt blocks at release
                landed_s = self._enqueue_writes(node, max(0, r.prompt_tokens // bt - r.hit_tokens // bt))
                self.sim.schedule_at(landed_s, self._to_client, super()._done, c)
                return
            decode_blocks = max(0, (r.prompt_tokens + r.gen_tokens - 1) // bt - (r.prompt_tokens + 1) // bt)
            landed_s = self._enqueue_writes(node, decode_blocks)
            # Its last step waits for them; charged before the DE's next run (same DE time; the
            # request's own done is not delayed here).
            self._stall_s[node] = max(self._stall_s.get(node, 0.0), landed_s - self.sim.now_s)
            self._written.discard(r.request_id)
        self._to_client(super()._done, c)

    # ---- what a node tells the client (first token, done) ----------------------------------------
    # Node -> scheduler -> client: two wake-ups on busy cores, the same trip as a DE's completion to the
    # scheduler and the next command back, whose in-situ mean is `decode_restart_s` (the HTTP legs,
    # measured on an idle host, stay in the arrival). The client sees its first token, and sends its
    # next round, that much later.
    def _to_client(self, deliver: Any, c: Any) -> None:
        if self.decode_restart_s > 0.0:
            self.sim.schedule(self.decode_restart_s, deliver, c)
        else:
            deliver(c)

    def _milestone(self, c: cmd.TokenMilestone) -> None:
        super()._milestone(c)
        if c.token_index == 1:
            self.times[c.request.request_id].first_token_s += self.decode_restart_s

    def _decode_start(self, node: int) -> None:
        if node in self._stalled:
            return
        stall = self._stall_s.pop(node, 0.0)
        if self.mode.skip_io:
            self._oracle_joins(node)
        if stall > 0.0:
            self._stalled.add(node)
            self.sim.schedule(stall, self._decode_resume, node)
            return
        super()._decode_start(node)
        run = self._decode[node]
        if run.busy:  # runtime/driver.py `_decode_next` (9637f57): one message per run of <= N steps
            # The run's message and completion, and one streamed chunk per request of its batch.
            batch = len(self.core.decode_shape(node))
            self._own_cpu("serve", 2 * self.overheads.control_cpu_s + batch * self.overheads.sse_chunk_cpu_s)
            self.sim.cancel(run.handle)  # type: ignore[arg-type]
            run.steps = max(1, min(run.steps, self.max_decode_run_steps))
            # run.step_s is the step's CPU seconds here (`_RuntimeCost.decode_step_max_s`); the run is
            # CPU work on the DE's thread, then the completion's trip back to the scheduler.
            self._decode_work[node] = self.host_cpu.submit(
                f"de{node}", run.steps * run.step_s, lambda: self._decode_computed(node),
                weight=self.cpu_factors["de_efficiency"],
            )  # fmt: skip
            self._run_began[node] = self.sim.now_s

    def _decode_computed(self, node: int) -> None:
        work = self._decode_work.pop(node)
        self._count_piece("de_engine", self.sim.now_s - self._run_began.pop(node), work.total_cpu_s)
        self.sim.schedule(self.decode_restart_s, self._decode_ran, node)

    def _decode_ran(self, node: int) -> None:
        run = self._decode[node]
        run.step_s = (self.sim.now_s - run.start_s) / run.steps  # wall per step, for back-dated milestones
        self._decode_event(node)

    def _decode_changed(self, c: cmd.DecodeChanged) -> None:
        """A joiner waits for the running step's boundary: the run's CPU work ends there."""
        run, work = self._decode[c.node_id], self._decode_work.get(c.node_id)
        if not run.busy:
            self._decode_start(c.node_id)
            return
        if work is None or run.step_s <= 0.0:  # computed; its completion is on the way
            return
        done = int(self.host_cpu.done_cpu_s(work) / run.step_s)
        if done + 1 < run.steps:
            run.steps = done + 1
            self.host_cpu.set_total(work, run.steps * run.step_s)

    def _decode_resume(self, node: int) -> None:
        self._stalled.discard(node)
        self._decode_start(node)  # joiners that came during the stall write their blocks too
