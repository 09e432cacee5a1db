"""Engines on one host's CPU: how the simulator runs when it predicts the CPU runtime (docs/twin.md).

The GPU simulator gives each engine a device of its own. The CPU runtime runs each engine as a Python
process with one torch thread, beside its scheduler and its client, on a host with a few cores. With a
`HostSpec` (plain values; the twin derives them from a calibration, `dualpath.twin.predict`)
`Simulation` executes the same commands this way; the step costs it is given are then CPU seconds.

- Shared cores (`host_cpu.HostCpu`): a forward is CPU work on the PE's thread, a decode run on the
  DE's, messages and streamed chunks on the scheduler's (`serve`), a request's HTTP side half there and
  half on the client's, each shared by processor sharing with a background of our own busy threads. A
  decode run keeps its thread only `de_efficiency` busy (the GIL, wake-ups: its wall grows with its CPU);
  a forward's thread computes flat out and the forward then stalls `pe_stall_s` (its wall beyond the CPU
  does not grow with the CPU: the step's hand-offs between the PE's threads, wake-ups).
  A layerwise forward's CPU starts with the step and its last layer waits for the last load
  (`engine.pipeline`'s form); a whole-KV forward's starts when its loads are done; an oracle forward
  is CPU alone. A joiner cuts a decode run at the step boundary its CPU progress has reached.
- Command trips (`command_trip_s`): scheduler -> engine thread before a forward computes, between a
  DE's decode runs (the core's run length, `CoreConfig.max_decode_run_steps`, one message each),
  scheduler -> DE and back around a copy into the cache (`h2d`), and node -> scheduler -> client for a
  first token and a `done`.
- HTTP legs: a round reaches the scheduler `http_leg_s` + per prompt token (times the core share) after
  the client sent it; TTFT counts from the send, as the load generator's does.
- Store writes (the runtime's `PipelinedWriter`): one job (persist command) at a time per DE node on its
  SNIC, durable `commit_s` after its last byte. Oracle (links unpaced): a job's blocks go straight to
  the DE node's `commits_in_flight` commit slots, `commit_s` each.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from dualpath.engine import commands as cmd
from dualpath.sim.host_cpu import CpuWork, HostCpu
from dualpath.sim.links import TrafficClass


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """What the runtime's processes pay beyond the step costs: cores, fixed times, CPU per message."""

    capacity_cores: float  # the host's cores less what other jobs took
    cpu_speed: float = 1.0  # the cores' speed against when the CPU costs were measured (`host_cpu`)
    background_cores: float = 0.0  # our threads that work all the time (reports, polls, copies)
    pe_stall_s: float = 0.0  # a PE forward's wall beyond its CPU, per forward, whatever its size
    de_efficiency: float = 1.0  # the share of its thread's time a DE decode run keeps busy
    client_cpu_factor: float = 1.0  # measured ÷ charged CPU of the client's side of a request
    command_trip_s: float = 0.0  # scheduler -> a node's engine thread (and a completion back)
    commit_s: float = 0.0  # one store commit (temp file, fsync, rename)
    commits_in_flight: int = 2  # a DE writer's commit pool
    http_leg_s: float = 0.0  # POST -> first chunk, idle: both legs of a TTFT
    http_leg_s_per_prompt_token: float = 0.0
    http_cpu_s: float = 0.0  # server + client CPU of one request
    http_cpu_s_per_prompt_token: float = 0.0
    control_cpu_s: float = 0.0  # one control message (both ends)
    sse_chunk_cpu_s: float = 0.0  # one further streamed chunk (server + client)


class _FifoWriter:
    """The runtime's `PipelinedWriter` pacing thread: one job's bytes at a time, in arrival order."""

    __slots__ = ("net", "then", "busy", "queue")

    def __init__(self, net: Any, then: Any) -> None:
        self.net, self.then = net, then
        self.busy = False
        self.queue: deque[tuple[float, cmd.StartPersist, tuple[Any, ...]]] = deque()

    def put(self, size_bytes: float, item: cmd.StartPersist, path: tuple[Any, ...]) -> None:
        self.queue.append((size_bytes, item, path))
        if not self.busy:
            self._next()

    def _next(self) -> None:
        size_bytes, item, path = self.queue.popleft()
        self.busy = True
        self.net.start_flow(size_bytes, path, TrafficClass.LOW, self._done, item, size_bytes)

    def _done(self, item: cmd.StartPersist, size_bytes: float) -> None:
        self.busy = False
        if self.queue:
            self._next()  # the link never waits for a commit (the commit pool runs beside it)
        self.then([item], size_bytes)


class RuntimeHost:
    """`Simulation`'s execution of forwards, decode runs, arrivals and writes on one CPU host."""

    def __init__(self, sim: Any, spec: HostSpec) -> None:
        self.s, self.spec = sim, spec  # the `Simulation` whose commands this executes
        self.cpu = HostCpu(
            sim.sim, spec.capacity_cores, background=spec.background_cores, speed=spec.cpu_speed
        )
        self.trip_s = spec.command_trip_s
        self._sent_s: dict[int, float] = {}  # agent -> when its client sent the round in flight
        self._forward_state: dict[int, list[bool]] = {}  # per PE node: [CPU done, loads done]
        self._forward_began: dict[int, float] = {}
        self._forward_work: dict[int, CpuWork] = {}
        self._decode_work: dict[int, CpuWork] = {}
        self._run_began: dict[int, float] = {}
        self._writer_free_s: dict[int, list[float]] = {}  # oracle: per DE node, when each slot is free
        self._fifo_writers: dict[int, _FifoWriter] = {}
        # The engines' pieces as the runtime's EngineWork counts them: [pieces, wall s, CPU s] per group.
        self.engine_work: dict[str, list[float]] = {"pe_engine": [0, 0.0, 0.0], "de_engine": [0, 0.0, 0.0]}

    def cpu_share(self, *, starting: int) -> float:
        """Wall ÷ CPU time of work that starts now with `starting` more threads and keeps that share."""
        return 1.0 / self.cpu.rate(extra=starting)

    def _own_cpu(self, thread: str, cpu_s: float) -> None:
        if cpu_s > 0.0:
            self.cpu.submit(thread, cpu_s * (self.spec.client_cpu_factor if thread == "client" else 1.0))

    def _count_piece(self, group: str, wall_s: float, cpu_s: float) -> None:
        counts = self.engine_work[group]
        counts[0] += 1
        counts[1] += wall_s
        counts[2] += cpu_s

    # ---- the client's HTTP legs ---------------------------------------------------------------------
    def send_round(self, agent: Any) -> None:
        h, s = self.spec, self.s
        prompt = agent.context_tokens + agent.rounds[agent.next_round][0]
        self._sent_s[agent.agent_id] = s.sim.now_s
        http_cpu_s = h.http_cpu_s + h.http_cpu_s_per_prompt_token * prompt
        self._own_cpu("serve", http_cpu_s / 2)
        self._own_cpu("client", http_cpu_s / 2)
        leg_s = (h.http_leg_s + h.http_leg_s_per_prompt_token * prompt) * self.cpu_share(starting=1)
        if leg_s > 0.0:
            s.sim.schedule(leg_s, self._arrive, agent)
        else:
            self._arrive(agent)

    def _arrive(self, agent: Any) -> None:
        request_id = self.s.num_requests
        self.s._arrive(agent)
        t = self.s.request_times(request_id)
        if t is not None:  # TTFT counts from the client's send
            t.arrival_s = self._sent_s.pop(agent.agent_id)

    # ---- a PE forward ---------------------------------------------------------------------------------
    def step_started(self, c: cmd.StartPrefillStep) -> None:
        # The scheduler's step message and the node's completion; each item's first token streamed.
        items = sum(len(b) for b in c.batches)
        self._own_cpu("serve", 2 * self.spec.control_cpu_s + items * self.spec.sse_chunk_cpu_s)
        self._forward_state[c.node_id] = [False, False]
        self._forward_began[c.node_id] = self.s.sim.now_s + self.trip_s

    def submit_forward(self, step: Any) -> None:
        """The forward's CPU on the PE's thread, once the step command reached it."""
        self.s.sim.schedule(self.trip_s, self._forward_on_pe, step, step.compute_s, self._forward_computed)

    def start_compute(self, step: Any) -> None:
        """Oracle: the forward (its hit's store read included in the step cost) as CPU alone."""
        self.s.sim.schedule(self.trip_s, self._forward_on_pe, step, step.compute_s, self.s._compute_done)

    def _forward_on_pe(self, step: Any, cpu_s: float, then: Any) -> None:
        stall_s = self.spec.pe_stall_s
        self._forward_work[step.c.node_id] = self.cpu.submit(
            f"pe{step.c.node_id}", cpu_s, lambda: self.s.sim.schedule(stall_s, then, step)
        )

    def _forward_computed(self, step: Any) -> None:
        state = self._forward_state[step.c.node_id]
        state[0] = True
        if state[1] or not step.c.layerwise:
            self.s._compute_done(step)

    def loads_finished(self, step: Any) -> None:
        state = self._forward_state[step.c.node_id]
        state[1] = True
        if not step.c.layerwise:
            self.submit_forward(step)
        elif state[0]:
            self.s.sim.schedule(step.last_layer_s / self.cpu.rate(extra=1), self.s._compute_done, step)

    def forward_done(self, node: int) -> None:
        began_s, work = self._forward_began.pop(node, None), self._forward_work.pop(node, None)
        if began_s is not None and work is not None:
            self._count_piece("pe_engine", self.s.sim.now_s - began_s, work.total_cpu_s)

    # ---- a DE's copy into its cache ------------------------------------------------------------------
    def h2d(self, c: cmd.StartH2D) -> None:
        """The scheduler's command reaches the DE's copy thread, the bytes cross its CNIC (loopback), and
        the completion goes back: a trip each way, as for a forward's and a decode run's commands."""
        s, trip_s = self.s, self.trip_s

        def copied(request_id: int) -> None:
            s.sim.schedule(trip_s, s._h2d_done, request_id)

        def arrived() -> None:
            s.net.start_flow(c.tokens * s.kv_bytes, s.topo.h2d(c.de_engine), TrafficClass.LOW, copied,
                             c.request_id)  # fmt: skip

        s.sim.schedule(trip_s, arrived)

    # ---- store writes -----------------------------------------------------------------------------
    def persist(self, c: cmd.StartPersist) -> None:
        """One job on the DE node's FIFO writer, sent when the command arrives."""
        s, de = self.s, c.de_engine
        node = s.core.node_of_engine(de)
        if s.mode.skip_io:  # oracle: unpaced bytes, only the commits take time
            landed_s = self._enqueue_writes(node, c.tokens // s.cluster.scheduler.block_tokens)
            s.sim.schedule_at(landed_s, s._persisted, [c], c.tokens * s.kv_bytes)
            return
        writer = self._fifo_writers.get(node)
        if writer is None:
            writer = self._fifo_writers[node] = _FifoWriter(s.net, self._persisted)
        # Decode-time blocks are copied out of the cache (the D2H) and then cross the same SNIC.
        path = s.topo.d2h(de) + s.topo.persist(de)[1:] if c.from_hbm else s.topo.persist(de)
        writer.put(c.tokens * s.kv_bytes, c, path)

    def _persisted(self, items: list[cmd.StartPersist], size: float) -> None:
        self.s.sim.schedule(self.spec.commit_s, self.s._persisted, items, size)

    def _enqueue_writes(self, node: int, blocks: int) -> float:
        """Oracle: queue `blocks` commits on the DE's commit pool; returns when the last one lands."""
        now: float = self.s.sim.now_s
        free = self._writer_free_s.setdefault(node, [0.0] * self.spec.commits_in_flight)
        landed_s = now
        for _ in range(blocks):
            slot = min(range(len(free)), key=free.__getitem__)
            free[slot] = max(free[slot], now) + self.spec.commit_s
            landed_s = max(landed_s, free[slot])
        return landed_s

    # ---- what a node tells the client (done) --------------------------------------------------------
    def done(self, c: cmd.RequestDone) -> None:
        if self.trip_s > 0.0:
            self.s.sim.schedule(self.trip_s, self.s._request_done, c)
        else:
            self.s._request_done(c)

    # ---- decode runs --------------------------------------------------------------------------------
    def run_decode(self, node: int, run: Any, batch: int) -> None:
        """One command per run (the core's length); `run.step_s` is CPU seconds here."""
        self._own_cpu("serve", 2 * self.spec.control_cpu_s + batch * self.spec.sse_chunk_cpu_s)
        self._decode_work[node] = self.cpu.submit(
            f"de{node}", run.steps * run.step_s, lambda: self._decode_computed(node),
            weight=self.spec.de_efficiency,
        )  # fmt: skip
        self._run_began[node] = self.s.sim.now_s

    def _decode_computed(self, node: int) -> None:
        work = self._decode_work.pop(node)
        self._count_piece("de_engine", self.s.sim.now_s - self._run_began.pop(node), work.total_cpu_s)
        self.s.sim.schedule(self.trip_s, self._decode_ran, node)

    def _decode_ran(self, node: int) -> None:
        run = self.s._decode_run(node)
        run.step_s = (self.s.sim.now_s - run.start_s) / run.steps  # wall per step: back-dated milestones
        self.s._decode_event(node)

    def cut_decode(self, node: int, run: Any) -> None:
        """A joiner waits for the running step's boundary: the run's CPU work ends there."""
        work = self._decode_work.get(node)
        if work is None or run.step_s <= 0.0:  # computed; its completion is on the way
            return
        done = int(self.cpu.done_cpu_s(work) / run.step_s)
        if done + 1 < run.steps:
            run.steps = done + 1
            self.cpu.set_total(work, run.steps * run.step_s)
