"""The simulator driver: `ClusterCore` on a virtual clock, every byte on the fluid link network.

NOTE: the driver makes no decision. It executes the core's commands as flows and timers and calls the
core back when they finish; the cost model says how long GPU work takes. Shortcuts that keep 1,152
GPUs fast (DESIGN §4 "sim"): one step event per lock-stepped node, one flow per hop per batch with the
layerwise pipeline in closed form (`prefill_timing`), decode advanced in runs of steps between batch
changes as the core sets them (a last token or a joiner), group fetches as the core wants them
(`wants_fetch`, coalesced to one per instant), and KV persistence through one write pipe per DE engine
(D2H) and per node (SNIC) that carries every block queued while its previous write was in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import numpy as np
from mypy_extensions import mypyc_attr

from dualpath.architecture import arch
from dualpath.config.specs import ClusterSpec
from dualpath.engine import commands as cmd
from dualpath.engine.core import ClusterCore, CoreConfig
from dualpath.engine.decode import DecodeNode
from dualpath.engine.modes import get_mode
from dualpath.policy.decisions import Assignment, DecisionLog
from dualpath.policy.inputs import PolicyInputs
from dualpath.records import fields_repr
from dualpath.request import Request, hit_tokens_for
from dualpath.sim.agents import Agent, Round
from dualpath.sim.cost import CostModel, gpu_cost_model
from dualpath.sim.early_stop import EarlyStop, EarlyStopWatch, TtftP90Watch
from dualpath.sim.gc_tuning import held_back_gc
from dualpath.sim.host import HostSpec, RuntimeHost
from dualpath.sim.huge_pages import use_huge_page_arenas
from dualpath.sim.kernel import EventHandle, Simulator
from dualpath.sim.links import Link, LinkNetwork, TrafficClass, same_links
from dualpath.sim.prefill_timing import layerwise_end_s, whole_kv_end_s
from dualpath.sim.rates import core_rates, hbm_kv_tokens
from dualpath.sim.topology import Topology

LOW: Final = TrafficClass.LOW
SAMPLE_INTERVAL_S: Final = 1.0  # queue-length samples for `-o DIR` plots
# Fig. 13 compares SNIC read traffic "within a small window" (§7.5): bytes read per SNIC are sampled at the
# first read event at or after each multiple of this (no events of their own; module `_snic_sample`).
SNIC_WINDOW_S: Final = 10.0
# Not yet happened, as a compiled constant (`math.nan` is two dict lookups; a request's times start with eight).
_NAN: Final = math.nan


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    cluster: ClusterSpec
    mode: str
    read_path: str | None = None
    aps: float | None = None  # None: offline, every agent starts at t = 0
    duration_s: float | None = None  # online: stop here
    record_links: bool = False
    # Record every link's rate (as `record_links` does, without its queue samples) for the summary's
    # `link_utilisation`: what `advise` ranks to name a run's binding link, from the run itself.
    link_summary: bool = False
    # The twin (dualpath.twin) predicts the CPU runtime: a calibrated cost model, and the core's α, β and
    # §6.4 predictor from the runtime's profile (`policy.inputs`). None: from the specs' (`sim/rates.py`).
    cost_model: CostModel | None = None
    policy: PolicyInputs | None = None
    # ... and engines on one CPU host (sim/host.py): the step costs it charges (CPU seconds), the host's
    # cores and fixed times, the agents' start times as its load generator draws them. None: a GPU
    # cluster, step costs from `cost_model`, Poisson starts from the seed.
    step_costs: StepCosts | None = None
    host: HostSpec | None = None
    agent_starts_s: tuple[float, ...] | None = None
    # Online runs: stop once clearly past the TTFT SLO (sim/early_stop.py); None runs to the end.
    early_stop: EarlyStop | None = None
    # Stop once the run's TTFT p90 is certain to exceed this (sim/early_stop.py `TtftP90Watch`: a proof,
    # online or offline); None runs to the end. Off with `failures` (continuations add first tokens).
    stop_p90_ttft_s: float | None = None
    # Decode steps per run (`CoreConfig.max_decode_run_steps`): the twin gives the runtime's; None: a run
    # goes to the next batch change.
    max_decode_run_steps: int | None = None
    # Node failures (`simulate --fail`): (node id, time s, seconds down or None: for good), run through
    # the core's own entry points (`ClusterCore.on_node_down` / `on_node_up`), as the runtime runs them.
    failures: tuple[tuple[int, float, float | None], ...] = ()
    # Keep every decision in `Simulation.log.entries` (tests compare two drivers' logs). Off, each
    # fetch's decisions are dropped once their times are stamped and the log keeps its read-token sums
    # (`DecisionLog.read_tokens`, all the summary reads): a run's results then hold one `RequestTimes`
    # per request; the decisions were 1.6 GB of a 48P96D run's 4.2 GB peak (benchmarks/README.md).
    keep_decisions: bool = False


class StepCosts(Protocol):
    """What the driver asks of a cost model (`CostModel`; the twin gives one that charges CPU instead)."""

    def prefill_step_s(
        self, per_gpu_batches: Sequence[Sequence[tuple[int, int]]], layer_index: int
    ) -> tuple[float, float, list[float]]: ...

    def decode_step_max_s(self, shape: Sequence[tuple[int, int]]) -> float: ...


_REQUEST_TIMES_FIELDS = (
    "agent",
    "round_index",
    "prompt_tokens",
    "hit_tokens",
    "gen_tokens",
    "pe_read_tokens",
    "de_read_tokens",
    "arrival_s",
    "scheduled_s",
    "read_start_s",
    "read_end_s",
    "prefill_start_s",
    "pe_engine",
    "de_engine",
    "first_token_s",
    "second_token_s",
    "last_token_s",
    "done_s",
)  # slots and repr


@mypyc_attr(acyclic=True)  # plain numbers only: in no reference cycle (docs/simulator-native.md)
class RequestTimes:
    """One request's milestones (NaN: not reached), kept to the end of a run (≈8 M at 48P96D).

    A plain slotted class for the native build's sake: a dataclass's generated `__init__` stays
    interpreted code (docs/simulator-native.md), and one is built per request.
    """

    __slots__ = _REQUEST_TIMES_FIELDS

    def __init__(
        self,
        agent: int,
        round_index: int,
        prompt_tokens: int,
        hit_tokens: int,
        gen_tokens: int,
        *,
        arrival_s: float,
    ) -> None:
        self.agent = agent
        self.round_index = round_index
        self.prompt_tokens = prompt_tokens
        self.hit_tokens = hit_tokens
        self.gen_tokens = gen_tokens
        self.pe_read_tokens = 0
        self.de_read_tokens = 0
        self.arrival_s = arrival_s
        self.scheduled_s = _NAN  # assigned to a (PE, DE) pair
        self.read_start_s = _NAN  # its first storage read started
        self.read_end_s = _NAN  # its last storage read finished
        self.prefill_start_s = _NAN  # its first forward started
        self.pe_engine = -1
        self.de_engine = -1
        self.first_token_s = _NAN
        self.second_token_s = _NAN
        self.last_token_s = _NAN
        self.done_s = _NAN

    def __repr__(self) -> str:
        return fields_repr(self, _REQUEST_TIMES_FIELDS)


class _Step:
    """A PE node's prefill step in flight: its command, timing and outstanding flows."""

    __slots__ = ("c", "start_s", "compute_s", "last_layer_s", "loads", "outs", "compute_done", "dead")

    def __init__(
        self, c: cmd.StartPrefillStep, start_s: float, compute_s: float, last_layer_s: float
    ) -> None:
        self.c = c
        self.start_s = start_s
        self.compute_s = compute_s
        self.last_layer_s = last_layer_s
        self.loads = 0
        self.outs = 0
        self.compute_done = False
        self.dead = False  # its node failed: its flows and timers end in nothing


@dataclass(slots=True)
class _DecodeRun:
    start_s: float = 0.0
    step_s: float = 0.0
    steps: int = 0
    handle: EventHandle | None = None
    busy: bool = False


class _WritePipe:
    """One write at a time along `path`; what arrives meanwhile goes out together in the next write.

    NOTE: a traffic manager posts the blocks that filled since its last write as one batch (doorbell
    batching, §5); as a single flow gets the whole max-min share, the link never idles while blocks
    wait, and the simulator moves one flow per batch instead of one per block.
    """

    __slots__ = ("net", "path", "then", "_on_done", "busy", "pending_bytes", "pending", "touched")

    def __init__(self, net: LinkNetwork, path: tuple[Link, ...], then: Callable[[list, float], None]) -> None:  # type: ignore[type-arg]
        self.net, self.path, self.then = net, path, then
        self._on_done: Callable[[list, float], None] = self._done  # type: ignore[type-arg]  # bound once
        self.busy = False
        self.pending_bytes = 0.0
        self.pending: list = []  # type: ignore[type-arg]
        self.touched = False  # in the driver's list of pipes to flush at the end of its commands

    def put(self, size_bytes: float, item: object) -> None:
        """Queue a write; `flush()` (once the instant's commands are handled) sends it."""
        self.pending_bytes += size_bytes
        self.pending.append(item)

    def flush(self) -> None:
        if self.pending and not self.busy:
            self._start()

    def _start(self) -> None:
        items, size = self.pending, self.pending_bytes
        self.pending, self.pending_bytes, self.busy = [], 0.0, True
        self.net.start_flow(size, self.path, LOW, self._on_done, items, size)

    def _done(self, items: list, size: float) -> None:  # type: ignore[type-arg]
        self.busy = False
        if self.pending:
            self._start()
        self.then(items, size)


@dataclass
class SimOutcome:
    agents: list[Agent]
    requests: dict[int, RequestTimes]
    end_s: float
    events: int
    topology: Topology
    log: DecisionLog
    core: ClusterCore
    queue_samples: list[tuple[float, int, float]] = field(default_factory=list)  # (t, waiting, Mtokens)
    attention_ratios: list[float] = field(default_factory=list)  # per PE step: max/mean GPU attention
    stop_reason: str | None = None  # why the run stopped early (SimConfig.early_stop); None: it did not
    # The same ratio over the steps where every GPU of the node had work: the imbalance batching can
    # act on (a GPU with nothing ready waits in every mode; Fig. 14 compares how batches are packed).
    attention_ratios_busy: list[float] = field(default_factory=list)
    # When each of those steps started (Fig. 14 by the run's progress), index for index.
    attention_times_s: list[float] = field(default_factory=list)
    attention_busy_times_s: list[float] = field(default_factory=list)
    # (time, bytes read so far by each node's SNIC, in node order): windows of ≈ SNIC_WINDOW_S (Fig. 13).
    snic_read_samples: list[tuple[float, tuple[float, ...]]] = field(default_factory=list)
    # With `record_links` (`-o`), once a second per node: (reads queued, reads in flight, DRAM buffer used
    # fraction), in node order; what `read_waits` in the summary reads (does a SNIC idle while reads wait?).
    reader_samples: list[tuple[tuple[int, int, float], ...]] = field(default_factory=list)

    def topology_links(self) -> dict[str, Link]:
        return self.topology.links


class Simulation:
    def __init__(self, config: SimConfig, trajectories: Sequence[Sequence[Round]], *, seed: int) -> None:
        c = config.cluster
        self.config, self.cluster = config, c
        self.sim = Simulator()
        self.net = LinkNetwork(self.sim, high_priority_share=c.hardware.high_priority_share)
        nodes = c.num_prefill_nodes + c.num_decode_nodes
        # Links that provably never bind leave the paths (same rates, less work) unless links are recorded.
        record = config.record_links or config.link_summary
        self.topo = Topology(self.net, c.hardware, nodes, record=record, drop_unbinding=not record)
        g = c.hardware.gpus_per_node
        cost = config.cost_model or gpu_cost_model(c.model, c.hardware, decode_ep_size=c.num_decode_nodes * g)
        self.cost: StepCosts = config.step_costs or cost
        # The plain cost model when it is the step costs: called as its own class, natively (a call
        # through the `StepCosts` protocol is a generic method call per step); None with another one.
        self._cost_model: CostModel | None = None if config.step_costs else cost
        self.kv_bytes = arch.kv_bytes_per_token(c.model)
        ctx, app = _typical(trajectories)
        rates = config.policy or core_rates(c, cost, context_tokens=ctx, append_tokens=app)
        self.mode = get_mode(config.mode)
        self.log = DecisionLog()
        self.core = ClusterCore(
            CoreConfig(
                num_prefill_nodes=c.num_prefill_nodes,
                num_decode_nodes=c.num_decode_nodes,
                engines_per_node=g,
                mode=self.mode,
                scheduler=c.scheduler,
                kv_bytes_per_token=self.kv_bytes,
                dram_buffer_bytes=c.hardware.dram_buffer_bytes,
                de_hbm_kv_tokens=hbm_kv_tokens(c, role_gpus=c.num_decode_nodes * g),
                pe_hbm_kv_tokens=hbm_kv_tokens(c, role_gpus=c.num_prefill_nodes * g),
                read_tokens_per_s=rates.read_tokens_per_s,
                alpha_tokens=rates.alpha_tokens,
                beta_tokens=rates.beta_tokens,
                read_path=config.read_path,
                max_decode_run_steps=config.max_decode_run_steps,
            ),
            attention_time_s=rates.attention_time_s,
            log=self.log,
        )
        self.rates = rates
        _check_requests_fit(trajectories, self.core.config.de_hbm_kv_tokens, c)
        self.agents = [Agent(i, t, 0.0) for i, t in enumerate(trajectories)]
        # Per request, indexed by its id (the driver numbers requests 0, 1, 2, ... as it makes them): its
        # milestones, and its agent until it is done or re-planned (then None). Lists, not dicts keyed by
        # id: an id is a fresh int object at every lookup, which a dict compares with its key by value.
        self._times: list[RequestTimes] = []
        self._agent_of: list[Agent | None] = []
        self._steps: list[_Step | None] = [None] * nodes  # each PE node's step in flight, at its node id
        # Each DE node's decode run at its node id (None at a PE node's): a list, not a dict, read at
        # every decode event without hashing.
        self._decode: list[_DecodeRun | None] = [None] * nodes
        for n in self.core.de_nodes:
            self._decode[n] = _DecodeRun()
        self._fetch_pending = False
        self._io_free: list[cmd.StartPersist] = []  # oracle persists (no I/O time), done after `_do`
        # The D2H pipe of each DE engine, at its engine id (None: none yet): a list, not a dict, since
        # an int key above 256 is a new object at each lookup, which the dict compares by value.
        self._d2h_pipes: list[_WritePipe | None] = [None] * (nodes * g)
        self._persist_pipes: list[_WritePipe | None] = [None] * nodes  # at the DE node's id
        # Pipes with writes queued by the commands being handled, each once (`_WritePipe.touched`), in
        # the order first queued: flushed together after them (`_do`).
        self._touched: list[_WritePipe] = []
        self._samples: list[tuple[float, int, float]] = []
        self._reader_samples: list[tuple[tuple[int, int, float], ...]] = []
        self._attention_ratios: list[float] = []
        self._attention_ratios_busy: list[float] = []
        self._attention_times_s: list[float] = []
        self._attention_busy_times_s: list[float] = []
        self._snic_samples: list[tuple[float, tuple[float, ...]]] = []
        self._snic_next_s = 0.0  # the next window boundary; the first read event samples t = 0
        self._keep_decisions = config.keep_decisions
        # Early stops fed with each first token, in this order, until one gives a reason to stop.
        self._watches: list[EarlyStopWatch | TtftP90Watch] = []
        if config.early_stop is not None:
            self._watches.append(EarlyStopWatch(config.early_stop))
        self.stop_reason: str | None = None
        self.failure_log: list[tuple[float, int, int]] = []  # (time s, node, requests re-planned)
        # Handed to the kernel and the link network on every flow or step: bound once here, because in
        # the native build each `self._read_done` used as a value builds a new bound-method object.
        self._on_read_done: Callable[[cmd.StartRead], None] = self._read_done
        self._on_h2d_done: Callable[[int], None] = self._h2d_done
        self._on_load_done: Callable[[_Step], None] = self._load_done
        self._on_out_done: Callable[[_Step], None] = self._out_done
        self._on_compute_done: Callable[[_Step], None] = self._compute_done
        self._on_decode_event: Callable[[int], None] = self._decode_event
        self._on_fetch: Callable[[], None] = self._fetch
        # Read on every arrival and step: plain fields of this (native) class, not config lookups.
        self._block_tokens = c.scheduler.block_tokens
        self._num_layers = c.model.num_layers
        # Engines on one CPU host (the twin): forwards, decode runs, arrivals and writes run there.
        self.host = None if config.host is None else RuntimeHost(self, config.host)
        self._arrivals(np.random.default_rng(seed))
        if config.stop_p90_ttft_s is not None and not config.failures:
            # One first token per round at most, of the agents that arrive before the run's end.
            end = math.inf if config.duration_s is None else config.duration_s
            rounds = sum(len(a.rounds) for a in self.agents if a.start_s < end)
            self._watches.append(TtftP90Watch(config.stop_p90_ttft_s, max(1, rounds)))
        for node, at_s, down_s in config.failures:
            self.sim.schedule_at(at_s, self._fail, node, down_s)

    # ---- the loop: every callback ends in _do(commands) -----------------------------------------
    def run(self, progress: Callable[[Simulator], None] | None = None) -> SimOutcome:
        if progress is not None:
            self.sim.set_progress(progress, every_events=20_000)
        if self.config.record_links:
            self.sim.schedule(0.0, self._sample, priority=2)
        use_huge_page_arenas()  # speed only (sim/huge_pages.py)
        with held_back_gc():  # speed only (sim/gc_tuning.py)
            self.sim.run(until_s=self.config.duration_s)
        if not self._keep_decisions:
            self.log.take_unread(keep=False)  # the batches logged after the last fetch: none is kept
        self._snic_final_sample()
        return SimOutcome(self.agents, self.times, self.sim.now_s, self.sim.events_processed, self.topo,
                          self.log, self.core, self._samples, self._attention_ratios, self.stop_reason,
                          self._attention_ratios_busy, self._attention_times_s, self._attention_busy_times_s,
                          self._snic_samples, self._reader_samples)  # fmt: skip

    def _snic_sample(self, now_s: float) -> None:
        """Bytes read so far per SNIC, at the first read event at or after a window boundary.

        NOTE: sampling on read events, not on timer events of its own, adds no event and moves no
        decision; a window then runs from one sample to the next (≈ SNIC_WINDOW_S, longer across a
        stretch without reads). A link's byte count is exact at any time after its last rate change.
        """
        nodes = self.topo.nodes
        self._snic_samples.append((now_s, tuple(n.snic_rx.bytes_carried(now_s) for n in nodes)))
        self._snic_next_s = (math.floor(now_s / SNIC_WINDOW_S) + 1) * SNIC_WINDOW_S

    def _snic_final_sample(self) -> None:
        """The run's end closes the last window; a last window under half a window joins the one before.

        The end is the last agent's finish when every agent finished (the loop may run on: `-o` samples
        queues once a second), else the loop's end.
        """
        now = run_end_s(self.agents, self.sim.now_s)
        samples = self._snic_samples
        if not samples or samples[-1][0] >= now:
            return
        if len(samples) > 1 and now - samples[-1][0] < SNIC_WINDOW_S / 2:
            samples.pop()
        self._snic_sample(now)

    def _sample(self) -> None:
        reading = sum(r.read_q_tokens for r in self.core.readers) / 1e6
        self._samples.append((self.sim.now_s, self.core.scheduler.waiting, reading))
        self._reader_samples.append(
            tuple(
                (reader.queued, reader.inflight, buffer.used / max(buffer.capacity, 1.0))
                for reader, buffer in zip(self.core.readers, self.core.buffers, strict=True)
            )
        )
        if any(math.isnan(a.end_s) for a in self.agents):
            self.sim.schedule(SAMPLE_INTERVAL_S, self._sample, priority=2)

    def _do(self, commands: list[cmd.Command]) -> None:
        for c in commands:
            # An isinstance chain, most frequent first (2P4D 128 agents: ≈ 3.3 persists and 3 milestones
            # per request, one of each of the next four, fewer prefill steps): the native build tests
            # each type by pointer and calls the handler directly, where a dict of bound methods costs a
            # lookup and a generic call.
            if isinstance(c, cmd.StartPersist):
                self._persist(c)
            elif isinstance(c, cmd.TokenMilestone):
                self._milestone(c)
            elif isinstance(c, cmd.RequestDone):
                self._done(c)
            elif isinstance(c, cmd.StartH2D):
                self._h2d(c)
            elif isinstance(c, cmd.DecodeChanged):
                self._decode_changed(c)
            elif isinstance(c, cmd.StartRead):
                self._read(c)
            elif isinstance(c, cmd.StartPrefillStep):
                self._start_step(c)
            else:
                raise TypeError(f"no handler for command {c!r}")
        if self._touched:  # writes queued by these commands leave together
            touched, self._touched = self._touched, []
            for pipe in touched:
                pipe.touched = False
                pipe.flush()
        while self._io_free:  # oracle: persists done at once, after the commands that came with them
            done, self._io_free = self._io_free, []
            for persist in done:
                self._do(self.core.on_persist_done(persist.request_id, persist.from_hbm, self.sim.now_s))
        if self.core.wants_fetch and not self._fetch_pending:
            # The core's fetch cadence: the group leaders fetch once, at the end of this instant.
            self._fetch_pending = True
            self.sim.schedule(0.0, self._on_fetch, priority=1)

    def _fetch(self) -> None:
        self._fetch_pending = False
        commands = self.core.fetch(self.sim.now_s)
        for a in self.log.take_unread(keep=self._keep_decisions):  # logged since the last fetch
            if isinstance(a, Assignment):
                t = self._times[a.request_id]
                t.scheduled_s, t.pe_engine, t.de_engine = self.sim.now_s, a.pe_engine, a.de_engine
        self._do(commands)

    # ---- agents --------------------------------------------------------------------------------
    def _arrivals(self, rng: np.random.Generator) -> None:
        if self.config.agent_starts_s is not None:
            for agent, start_s in zip(self.agents, self.config.agent_starts_s, strict=True):
                agent.start_s = start_s
                self.sim.schedule_one_at(start_s, self._next_round, agent)
            return
        t = 0.0
        for agent in self.agents:
            if self.config.aps:
                t += float(rng.exponential(1.0 / self.config.aps))
            agent.start_s = t
            self.sim.schedule_one_at(t, self._next_round, agent)

    def _next_round(self, agent: Agent) -> None:
        if self.host is not None and agent.next_round < len(agent.rounds):
            self.host.send_round(agent)  # the client's HTTP leg; it calls `_arrive`
        else:
            self._arrive(agent)

    def _arrive(self, agent: Agent) -> None:
        now = self.sim.now_s
        request = agent.next_request(len(self._times), now, self._block_tokens)
        if request is None:
            agent.end_s = now
            return
        self._new_request(request, agent, now)
        self._do(self.core.submit(request, now))

    def _new_request(self, request: Request, agent: Agent, now_s: float) -> None:
        """Its milestones and agent, at its id: the next index of both lists."""
        assert request.request_id == len(self._times), (request.request_id, len(self._times))
        self._times.append(RequestTimes(
            agent.agent_id, request.round_index, request.prompt_tokens, request.hit_tokens, request.gen_tokens,
            arrival_s=now_s))  # fmt: skip
        self._agent_of.append(agent)

    def _pop_agent(self, request_id: int) -> Agent:
        """The request's agent, once: it is done or re-planned (a second call is a bug: KeyError)."""
        agent = self._agent_of[request_id]
        if agent is None:
            raise KeyError(f"request {request_id} has no agent: done or re-planned already")
        self._agent_of[request_id] = None
        return agent

    @property
    def times(self) -> dict[int, RequestTimes]:
        """Every request's milestones by request id (a new dict: for the outcome and inspection)."""
        return dict(enumerate(self._times))

    @property
    def num_requests(self) -> int:
        return len(self._times)

    def request_times(self, request_id: int) -> RequestTimes | None:
        """The request's milestones; None for an id not made yet."""
        return self._times[request_id] if 0 <= request_id < len(self._times) else None

    def _done(self, c: cmd.RequestDone) -> None:
        if self.host is not None:
            self.host.done(c)  # oracle writes, the trip to the client; it calls `_request_done`
        else:
            self._request_done(c)

    def _request_done(self, c: cmd.RequestDone) -> None:
        t = self._times[c.request_id]
        t.done_s = self.sim.now_s
        t.pe_read_tokens, t.de_read_tokens = c.pe_read_tokens, c.de_read_tokens
        self._next_round(self._pop_agent(c.request_id))

    def _milestone(self, c: cmd.TokenMilestone) -> None:
        t = self._times[c.request_id]
        if c.token_index == 1:
            t.first_token_s = self.sim.now_s
            if self.host is not None:  # node -> scheduler -> client
                t.first_token_s += self.host.trip_s
            for watch in self._watches:
                if self.stop_reason is None:
                    self.stop_reason = watch.first_token(t.first_token_s - t.arrival_s, t.first_token_s)
                    if self.stop_reason is not None:
                        self.sim.stop()
        elif c.token_index == 2:
            run = self._decode[self.core.node_of_engine(c.de_engine)]
            back_s = c.steps_before_now * run.step_s if run is not None else 0.0
            t.second_token_s = self.sim.now_s - back_s
        if c.last:
            t.last_token_s = self.sim.now_s
            if c.token_index >= 2:
                pipe = self._d2h_pipes[c.de_engine]
                if pipe is not None:
                    self._touch(pipe)

    # ---- node failures (DESIGN §4 "faults"): the core decides, as in the runtime ------------------
    def _fail(self, node: int, down_s: float | None) -> None:
        """The node dies now: its step and decode run end in nothing (flows already on its links run
        out unheeded), the core re-plans its requests, each continues as a new request (its prompt +
        the tokens out, the rest of its output; its hit = what its blocks persisted), and with
        `down_s` the node joins again that much later."""
        step = self._steps[node]
        if step is not None:
            step.dead = True
        run = self._decode[node]
        if run is not None and run.busy and run.handle is not None:
            self.sim.cancel(run.handle)
        if run is not None:
            self._decode[node] = _DecodeRun()
        decision = self.core.on_node_down(node)
        self.failure_log.append((self.sim.now_s, node, len(decision.replan)))
        self._do(list(decision.commands))
        for request in decision.replan:
            self._continue(request)
        if down_s is not None:
            self.sim.schedule(down_s, self._recover, node)

    def _continue(self, r: cmd.RequestView) -> None:
        now, block = self.sim.now_s, self._block_tokens
        prompt = r.prompt_tokens + r.generated_tokens
        persisted = max(r.hit_tokens, r.persisted_tokens if r.generated_tokens else 0)
        request = Request(
            request_id=len(self._times),
            trajectory_id=r.trajectory_id,
            round_index=r.round_index,
            prompt_tokens=prompt,
            hit_tokens=hit_tokens_for(persisted, prompt, block),
            gen_tokens=max(1, r.gen_tokens - r.generated_tokens),
            arrival_s=now,
        )
        self._new_request(request, self._pop_agent(r.request_id), now)
        self._do(self.core.submit(request, now))

    def _recover(self, node: int) -> None:
        self._do(self.core.on_node_up(node))

    # ---- storage, H2D, persistence ---------------------------------------------------------------
    def _read(self, c: cmd.StartRead) -> None:
        if self.sim.now_s >= self._snic_next_s:
            self._snic_sample(self.sim.now_s)
        t = self._times[c.request_id]
        if math.isnan(t.read_start_s):
            t.read_start_s = self.sim.now_s
        self.net.start_flow_one(c.tokens * self.kv_bytes, self.topo.read(c.node_id), LOW, self._on_read_done,
                                c)  # fmt: skip

    def _read_done(self, c: cmd.StartRead) -> None:
        """The read `c` started has landed (the command is its transfer's one argument: no tuple)."""
        if self.sim.now_s >= self._snic_next_s:
            self._snic_sample(self.sim.now_s)
        self._times[c.request_id].read_end_s = self.sim.now_s  # the last part's end stays
        self._do(self.core.on_read_done(c.node_id, c.request_id, self.sim.now_s))

    def _h2d(self, c: cmd.StartH2D) -> None:
        if self.host is not None:
            self.host.h2d(c)  # the command's trip to the DE and its completion's back; it calls `_h2d_done`
            return
        self.net.start_flow_one(c.tokens * self.kv_bytes, self.topo.h2d(c.de_engine), LOW, self._on_h2d_done,
                                c.request_id)  # fmt: skip

    def _h2d_done(self, request_id: int) -> None:
        self._do(self.core.on_h2d_done(request_id, self.sim.now_s))

    def _persist(self, c: cmd.StartPersist) -> None:
        if self.host is not None:
            self.host.persist(c)
            return
        if self.mode.skip_io:  # oracle: the write takes no time (§7.1)
            self._io_free.append(c)
            return
        size = c.tokens * self.kv_bytes
        pipe = self._d2h_pipe(c.de_engine) if c.from_hbm else self._persist_pipe(c.de_engine)
        pipe.put(size, c)  # the command is the write's item: no tuple of its fields, no boxed ints
        if not c.from_hbm:
            self._touch(pipe)
        # Decode-time blocks wait in their engine's pipe until a request of that engine emits its
        # last token (see `_milestone`): one write per engine per finish instead of one per block.

    def _touch(self, pipe: _WritePipe) -> None:
        """`pipe` goes in the list to flush after the commands being handled, once."""
        if not pipe.touched:
            pipe.touched = True
            self._touched.append(pipe)

    def _d2h_pipe(self, de_engine: int) -> _WritePipe:
        """Decode-time blocks: D2H through the CNIC and on through the SNIC as one flow.

        NOTE: the bytes cross the node's DRAM twice (D2H write, SNIC read) but the flow's path names
        the DRAM link once: decode blocks are ~0.3 GB/s per node against 500 GB/s of DRAM, so the
        error is < 0.1 % of that link, and one flow instead of two per write halves these events.
        """
        pipe = self._d2h_pipes[de_engine]
        if pipe is None:
            path = self.topo.d2h(de_engine) + self.topo.persist(de_engine)[1:]
            pipe = self._d2h_pipes[de_engine] = _WritePipe(self.net, path, self._persisted)
        return pipe

    def _persist_pipe(self, de_engine: int) -> _WritePipe:
        node = self.core.node_of_engine(de_engine)
        pipe = self._persist_pipes[node]
        if pipe is None:
            pipe = self._persist_pipes[node] = _WritePipe(
                self.net, self.topo.persist(de_engine), self._persisted
            )
        return pipe

    def _persisted(self, items: list[cmd.StartPersist], size: float) -> None:
        now, out = self.sim.now_s, []
        for c in items:
            out += self.core.on_persist_done(c.request_id, c.from_hbm, now)
        self._do(out)

    # ---- prefill: one step event per node, flows per hop, pipeline in closed form ----------------
    def _start_step(self, c: cmd.StartPrefillStep) -> None:
        if self.host is not None:
            self.host.step_started(c)
        per_gpu = [[(i.cached_tokens, i.new_tokens) for i in batch] for batch in c.batches]
        now = self.sim.now_s
        for batch in c.batches:
            for i in batch:
                t = self._times[i.request_id]
                if math.isnan(t.prefill_start_s):
                    t.prefill_start_s = now
        model, layer = self._cost_model, self._num_layers - 1
        if model is not None:
            compute_s, last_layer_s, attention = model.prefill_step_s(per_gpu, layer)
        else:
            compute_s, last_layer_s, attention = self.cost.prefill_step_s(per_gpu, layer)
        self._attention_balance(attention)
        step = _Step(c, now, compute_s, last_layer_s)
        self._steps[c.node_id] = step
        if self.mode.skip_io:
            self._start_compute(step)
            return
        paths, sizes = self._hops(c, "load")
        for k in range(len(paths)):
            step.loads += 1
            self.net.start_flow_one(sizes[k], paths[k], LOW, self._on_load_done, step)
        if c.layerwise:
            self._start_outs(step)
        if not step.loads:
            self._loads_finished(step)
        if self.host is not None and c.layerwise:  # layer i computes as its load lands: from the start
            self.host.submit_forward(step)

    def _start_compute(self, step: _Step) -> None:
        """Oracle: no loads, the forward's compute alone."""
        if self.host is not None:
            self.host.start_compute(step)
            return
        self.sim.schedule_one(step.compute_s, self._on_compute_done, step)

    def _attention_balance(self, attention: list[float]) -> None:
        """Paper Fig. 14: max over the node's GPUs of attention time / the mean, for this step."""
        total, most, least = 0.0, attention[0], attention[0]
        for a in attention:  # one loop, not sum/max/min: no interpreted builtin calls per step
            total += a
            if a > most:
                most = a
            if a < least:
                least = a
        mean = total / len(attention)
        if mean > 0:
            ratio = most / mean
            self._attention_ratios.append(ratio)
            self._attention_times_s.append(self.sim.now_s)
            if least > 0.0:
                self._attention_ratios_busy.append(ratio)
                self._attention_busy_times_s.append(self.sim.now_s)

    def _hops(self, c: cmd.StartPrefillStep, kind: str) -> tuple[list[tuple[Link, ...]], list[float]]:
        """One flow per (engine, source or destination) pair: the pairs' paths in the order they first
        appear, and each one's bytes of all layers and requests (`_add_hop`)."""
        paths: list[tuple[Link, ...]] = []
        sizes: list[float] = []
        kv_bytes = self.kv_bytes
        for batch in c.batches:
            for it in batch:
                de = it.de_engine
                if kind == "load":
                    if it.load_pe_tokens:
                        _add_hop(
                            paths, sizes, self.topo.load_local(it.pe_engine), it.load_pe_tokens * kv_bytes
                        )
                    if it.load_de_tokens:
                        path = self.topo.load_remote(de, it.pe_engine)
                        _add_hop(paths, sizes, path, it.load_de_tokens * kv_bytes)
                elif it.out_tokens:
                    _add_hop(paths, sizes, self.topo.kv_out(it.pe_engine, de), it.out_tokens * kv_bytes)
        return paths, sizes

    def _start_outs(self, step: _Step) -> None:
        paths, sizes = self._hops(step.c, "out")
        for i in range(len(paths)):
            step.outs += 1
            self.net.start_flow_one(sizes[i], paths[i], LOW, self._on_out_done, step)

    def _load_done(self, step: _Step) -> None:
        if step.dead:
            return
        step.loads -= 1
        if not step.loads:
            self._loads_finished(step)

    def _loads_finished(self, step: _Step) -> None:
        if self.host is not None:
            self.host.loads_finished(step)
            return
        now = self.sim.now_s
        if step.c.layerwise:
            end = layerwise_end_s(start_s=step.start_s, load_done_s=now, layers=self._num_layers,
                                  compute_s=step.compute_s, last_layer_s=step.last_layer_s)  # fmt: skip
        else:
            end = whole_kv_end_s(load_done_s=now, compute_s=step.compute_s)
        self.sim.schedule_one_at(max(end, now), self._on_compute_done, step)

    def _compute_done(self, step: _Step) -> None:
        if self.host is not None:
            self.host.forward_done(step.c.node_id)
        if step.dead:
            return
        step.compute_done = True
        c = step.c
        if self.mode.skip_io or (c.layerwise and not step.outs):
            self._step_finished(step)
        elif not c.layerwise:  # basic: the GPU is free; KV goes out after the forward
            self._do(self.core.on_prefill_step_done(c.node_id, c.step_id, self.sim.now_s))
            self._start_outs(step)
            if not step.outs:
                self._do(self.core.on_kv_out_done(c.node_id, c.step_id, self.sim.now_s))

    def _out_done(self, step: _Step) -> None:
        if step.dead:
            return
        step.outs -= 1
        if step.outs or not step.compute_done:
            return
        if step.c.layerwise:
            self._step_finished(step)
        else:
            self._do(self.core.on_kv_out_done(step.c.node_id, step.c.step_id, self.sim.now_s))

    def _step_finished(self, step: _Step) -> None:
        c, now = step.c, self.sim.now_s
        self._do(self.core.on_prefill_step_done(c.node_id, c.step_id, now)
                 + self.core.on_kv_out_done(c.node_id, c.step_id, now))  # fmt: skip

    # ---- decode: runs of steps between tokens of interest ---------------------------------------
    def _decode_changed(self, c: cmd.DecodeChanged) -> None:
        run = self._decode_run(c.node_id)
        if not run.busy:
            self._decode_start(c.node_id)
            return
        if not self.core.decode_cut_wanted(c.node_id):
            return  # its joiners merged already (several joins in one instant start one run)
        if self.host is not None:
            self.host.cut_decode(c.node_id, run)
            return
        # Joiners wait for the current step's boundary: cut the run there.
        done = int((self.sim.now_s - run.start_s) / run.step_s) if run.step_s > 0 else 0
        if done + 1 < run.steps:
            assert run.handle is not None  # a busy run has its event
            self.sim.cancel(run.handle)
            run.steps = done + 1
            run.handle = self.sim.schedule_one_at(
                run.start_s + run.steps * run.step_s, self._on_decode_event, c.node_id
            )

    def _decode_run(self, node: int) -> _DecodeRun:
        run = self._decode[node]
        assert run is not None, f"node {node} is not a DE node"
        return run

    def _decode_start(self, node: int) -> None:
        run = self._decode_run(node)
        run.steps = self.core.start_decode_run(node)
        run.busy = run.steps > 0
        if not run.busy:
            return
        model = self._cost_model
        decode_node = self.core.de_node(node)
        if model is not None:
            run.step_s = _decode_step_max_s(model, decode_node)
        else:
            run.step_s = self.cost.decode_step_max_s(self.core.decode_shape(node))
        run.start_s = self.sim.now_s
        if self.host is not None:
            self.host.run_decode(node, run, len(decode_node.engines))
            return
        run.handle = self.sim.schedule_one(run.steps * run.step_s, self._on_decode_event, node)

    def _decode_event(self, node: int) -> None:
        run = self._decode_run(node)
        commands = self.core.advance_decode(node, run.steps, self.sim.now_s)
        run.busy = False
        self._do(commands)
        if not run.busy:
            self._decode_start(node)


def _add_hop(
    paths: list[tuple[Link, ...]], sizes: list[float], path: tuple[Link, ...], size_bytes: float
) -> None:
    """Add `size_bytes` to `path`'s bytes in `Simulation._hops`' two lists, `path` appended if new.

    NOTE: a scan of the step's few paths, which compare by their links' identity as tuple keys of a dict
    compare `Link`s: a dict keyed by path hashed each tuple link by link at every item of every step
    (benchmarks/README.md)."""
    for i in range(len(paths)):
        if same_links(paths[i], path):
            sizes[i] += size_bytes
            return
    paths.append(path)
    sizes.append(size_bytes)


def _decode_step_max_s(model: CostModel, node: DecodeNode) -> float:
    """`model.decode_step_max_s(node.shape())` without the shape: engine by engine, no tuple or boxed
    int per engine (a DE node's step is costed at every change of its batch)."""
    best = -1.0
    for e in node.engines:
        t = model.decode_engine_step_s(e.running, node.context_tokens(e))
        if t > best:
            best = t
    return best


def run_end_s(agents: Sequence[Agent], loop_end_s: float) -> float:
    """When the run's work ended: the last agent's finish if all finished, else the event loop's end."""
    ends = [a.end_s for a in agents]
    return max(ends) if ends and not any(math.isnan(t) for t in ends) else loop_end_s


def _typical(trajectories: Sequence[Sequence[Round]]) -> tuple[int, int]:
    """Mean per-round context and append of the workload (for β)."""
    contexts, appends = [], []
    for t in trajectories:
        ctx = 0
        for append, gen in t:
            ctx += append
            contexts.append(ctx)
            appends.append(append)
            ctx += gen
    return int(np.mean(contexts)), max(1, int(np.median(appends)))


def _check_requests_fit(
    trajectories: Sequence[Sequence[Round]], de_hbm_kv_tokens: int, c: ClusterSpec
) -> None:
    """Refuse a run in which some round could never be placed (paper §6.2: a DE admits a request only when
    its HBM holds prompt + output), instead of letting the simulation stall with agents that never finish."""
    why = requests_fit_error(trajectories, de_hbm_kv_tokens, c)
    if why is not None:
        raise ValueError(why)


def requests_fit_error(
    trajectories: Sequence[Sequence[Round]], de_hbm_kv_tokens: int, c: ClusterSpec
) -> str | None:
    """Why no DE could ever admit some trajectory's last rounds (None: every round fits one DE's HBM)."""
    longest = max((sum(append + gen for append, gen in t) for t in trajectories), default=0)
    if longest <= de_hbm_kv_tokens:
        return None
    return (
        f"a trajectory reaches {longest:,} tokens but one decode engine of {c.model.name} on "
        f"{c.hardware.name} holds at most {de_hbm_kv_tokens:,} KV tokens (HBM less weights): no DE could "
        "ever admit its last rounds; use a smaller dataset, more decode GPUs per model replica or more HBM"
    )
