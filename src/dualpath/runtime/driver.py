"""`RuntimeDriver`: the runtime's driver of the decision core `ClusterCore` (DESIGN §2, docs/runtime.md).

NOTE: the simulator (`sim/driver.py`) and this driver run the same `ClusterCore`; they differ only in how
long a command takes. Here a command becomes a JSON message to the node that executes it, and the node's
completion report comes back as an event. The driver is sans-network and clock-injected: no sockets, no
clock reads, no threads, so a test (or the simulator's clock) can drive it and a recorded event log can be
replayed into a fresh driver to reproduce the same messages and decisions. It decides nothing itself.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dualpath.config.specs import SchedulerSpec
from dualpath.engine import commands as cmd
from dualpath.engine.core import ClusterCore, CoreConfig
from dualpath.engine.modes import get_mode
from dualpath.policy.decisions import Assignment, DecisionLog
from dualpath.policy.inputs import PrefillProfile, pairwise_attention_time, policy_inputs
from dualpath.policy.types import ReadSide
from dualpath.request import Phase, Request

Message = dict[str, Any]
Outgoing = list[tuple[str, Message]]
CLIENT = "@client"  # destination of token chunks and completions (the HTTP side)
# A DE runs up to this many decode steps per message (a run, `CoreConfig.max_decode_run_steps`). Chosen,
# not published: it bounds how late the client sees a token and a filled block's persist starts (both
# come at the run's end) to 8 steps, while one control round trip serves 8 steps.
DECODE_RUN_STEPS = 8


@dataclass(frozen=True, kw_only=True)
class DriverConfig:
    node_names: tuple[str, ...]  # PE nodes first (ids 0..P-1), then DE nodes, as RuntimeClusterSpec
    num_prefill_nodes: int
    engines_per_node: int
    mode: str
    read_path: str | None
    block_tokens: int
    kv_bytes_per_token: float  # all layers
    dram_buffer_bytes: float
    de_hbm_kv_tokens: int
    pe_hbm_kv_tokens: int
    snic_bytes_per_s: float
    prefill_tokens_per_s: float  # the slowest PE's measured rate (β, A.4)
    attention_s_per_token_pair: float = 0.0  # the PE's measured attention cost (§6.4 predictor)
    max_decode_run_steps: int = DECODE_RUN_STEPS


def prefill_profile(config: DriverConfig) -> PrefillProfile:
    """The PE profile the runtime measured at start-up (`runtime/model_host.py`), for `policy_inputs`."""
    return PrefillProfile(
        tokens_per_s=config.prefill_tokens_per_s,
        attention_time_s=pairwise_attention_time(config.attention_s_per_token_pair),
    )


@dataclass
class _Live:
    """What the driver keeps of a request it submitted: the client's side (the core keeps the rest)."""

    token_ids: list[int]
    planned_hit_tokens: int  # the hit it came with; the core's shrinks on a lost block
    sampling: Message = field(default_factory=dict)  # SamplingParams.to_message(): the nodes draw with it
    first_token: int | None = None
    finish_reason: str = "length"  # "stop" when a node saw an EOS or stop token, "abort" when cancelled
    times: dict[str, float] = field(default_factory=dict)


class RuntimeDriver:
    """`record`: keep every input event (`event_log`, each prompt's token ids among them) and every
    decision (`log.entries`) for a replay: the tests, and `serve --event-log`. Off (`serve` without it),
    the driver keeps only what its live requests need, so a long-lived server holds nothing per finished
    request."""

    def __init__(self, config: DriverConfig, *, record: bool = True) -> None:
        self.config = config
        self.record = record
        p = config.num_prefill_nodes
        d = len(config.node_names) - p
        spec = SchedulerSpec(block_tokens=config.block_tokens)
        inputs = policy_inputs(spec, read_bytes_per_s=config.snic_bytes_per_s,
                               kv_bytes_per_token=config.kv_bytes_per_token, prefill=prefill_profile(config))  # fmt: skip
        self.log = DecisionLog()
        self.core = ClusterCore(
            CoreConfig(
                num_prefill_nodes=p,
                num_decode_nodes=d,
                engines_per_node=config.engines_per_node,
                mode=get_mode(config.mode),
                scheduler=spec,
                kv_bytes_per_token=config.kv_bytes_per_token,
                dram_buffer_bytes=config.dram_buffer_bytes,
                de_hbm_kv_tokens=config.de_hbm_kv_tokens,
                pe_hbm_kv_tokens=config.pe_hbm_kv_tokens,
                read_tokens_per_s=inputs.read_tokens_per_s,
                alpha_tokens=inputs.alpha_tokens,
                beta_tokens=inputs.beta_tokens,
                read_path=config.read_path or None,
                max_decode_run_steps=config.max_decode_run_steps,
            ),
            attention_time_s=inputs.attention_time_s,
            log=self.log,
        )
        self.event_log: list[tuple[float, Message]] = []
        self._ids = {name: i for i, name in enumerate(config.node_names)}
        self._live: dict[int, _Live] = {}
        self._next_id = 0
        self._decode_step = {n: 0 for n in self.core.de_nodes}  # id of the node's latest run
        self._cut_sent = {n: False for n in self.core.de_nodes}  # `decode_cut` sent to the run in flight
        self._down: set[str] = set()
        self._handlers: dict[str, Callable[[Message, float], Outgoing]] = {
            "fetch": self._fetch,
            "read_done": self._read_done,
            "step_done": self._step_done,
            "kv_out_done": self._kv_out_done,
            "h2d_done": self._h2d_done,
            "persist_done": self._persist_done,
            "decode_done": self._decode_done,
            "cancel": self._cancel,
            "node_down": self._node_down,
            "node_up": self._node_up,
        }

    # ---- inputs --------------------------------------------------------------------------------
    @property
    def wants_fetch(self) -> bool:
        """The core's fetch cadence (`ClusterCore.wants_fetch`): the caller sends `{"type": "fetch"}`
        once it has drained its inbox (one fetch per instant, as the simulator coalesces them)."""
        return self.core.wants_fetch

    def submit(
        self,
        *,
        token_ids: Sequence[int],
        hit_tokens: int,
        max_tokens: int,
        now_s: float,
        sampling: Message | None = None,
    ) -> tuple[int, Outgoing]:
        """A new request; `sampling` is its `SamplingParams.to_message()` (default: greedy, no stop)."""
        rid = self._next_id
        event = {"type": "submit", "token_ids": list(token_ids), "hit_tokens": hit_tokens,
                 "max_tokens": max_tokens}  # fmt: skip
        if sampling:
            event["sampling"] = copy.deepcopy(sampling)
        if self.record:
            self.event_log.append((now_s, event))
        self._next_id += 1
        request = Request(
            request_id=rid,
            trajectory_id=0,
            round_index=0,
            prompt_tokens=len(token_ids),
            hit_tokens=hit_tokens,
            gen_tokens=max_tokens,
            arrival_s=now_s,
        )
        self._live[rid] = _Live(
            token_ids=list(token_ids),
            planned_hit_tokens=hit_tokens,
            sampling=dict(sampling or {}),
        )
        self._live[rid].times["arrival"] = now_s
        return rid, self._do(self.core.submit(request, now_s), now_s)

    def handle(self, event: Message, now_s: float) -> Outgoing:
        """One node completion (or a fetch); returns the messages to send now. A node's report about a
        request the core re-planned or abandoned (`node_down`, `cancel`) is stale: it is dropped here."""
        if self.record:
            self.event_log.append((now_s, copy.deepcopy(event)))
        handler = self._handlers.get(str(event.get("type")))
        if handler is None:
            raise ValueError(f"unknown driver event {event.get('type')!r}")
        if "rid" in event and int(event["rid"]) not in self._live:
            return []
        if event.get("node") in self._down and event["type"] not in ("node_down", "node_up"):
            return []  # a late word from a node already marked down
        return handler(event, now_s)

    @classmethod
    def replay(
        cls, config: DriverConfig, events: Sequence[tuple[float, Message]]
    ) -> tuple[RuntimeDriver, list[tuple[float, Outgoing]]]:
        """Feed a recorded event log into a fresh driver on its recorded timestamps."""
        driver = cls(config)
        out: list[tuple[float, Outgoing]] = []
        for now_s, event in events:
            if event["type"] == "submit":
                body = {k: v for k, v in event.items() if k != "type"}
                _, messages = driver.submit(**body, now_s=now_s)
            else:
                messages = driver.handle(event, now_s)
            out.append((now_s, messages))
        return driver, out

    def node_id(self, name: str) -> int:
        return self._ids[name]

    def node_name(self, node_id: int) -> str:
        return self.config.node_names[node_id]

    # ---- events ----------------------------------------------------------------------------------
    def _fetch(self, event: Message, now_s: float) -> Outgoing:
        commands = self.core.fetch(now_s)
        for a in self.log.take_unread(keep=self.record):  # logged since the last fetch
            if isinstance(a, Assignment) and a.request_id in self._live:
                self._live[a.request_id].times["pe_assigned"] = now_s
        return self._do(commands, now_s)

    def _read_done(self, event: Message, now_s: float) -> Outgoing:
        rid = int(event["rid"])
        node = self.node_id(event["node"])
        self._live[rid].times["read_end"] = now_s
        usable = event.get("usable_tokens")  # fewer than read: a corrupt or missing block (the core decides)
        return self._do(
            self.core.on_read_done(node, rid, now_s, None if usable is None else int(usable)), now_s
        )

    def _step_done(self, event: Message, now_s: float) -> Outgoing:
        node = self.node_id(event["node"])
        out: Outgoing = []
        for rid, token in event.get("first_tokens", ()):
            live, view = self._live.get(int(rid)), self.core.view(int(rid))
            if live is None or view is None or view.pe_engine is None:
                continue  # re-planned while in this step: its token comes from its continuation
            if self.core.node_of_engine(view.pe_engine) != node:
                continue
            live.first_token = int(token)
            live.times["prefill_end"] = now_s
            out.append((CLIENT, {"type": "tokens", "rid": int(rid), "token_ids": [int(token)]}))
        for rid in event.get("stopped", ()):  # token 1 was an EOS or stop token: no decode
            self._end_early(int(rid), 1, "stop")
        return out + self._do(self.core.on_prefill_step_done(node, int(event["step_id"]), now_s), now_s)

    def _kv_out_done(self, event: Message, now_s: float) -> Outgoing:
        node = self.node_id(event["node"])
        return self._do(self.core.on_kv_out_done(node, int(event["step_id"]), now_s), now_s)

    def _h2d_done(self, event: Message, now_s: float) -> Outgoing:
        self._live[int(event["rid"])].times["h2d_end"] = now_s
        return self._do(self.core.on_h2d_done(int(event["rid"]), now_s), now_s)

    def _persist_done(self, event: Message, now_s: float) -> Outgoing:
        rid, from_hbm = int(event["rid"]), bool(event["from_hbm"])
        return self._do(self.core.on_persist_done(rid, from_hbm, now_s), now_s)

    def _decode_done(self, event: Message, now_s: float) -> Outgoing:
        """A run ended after `steps` steps (all it was asked, or fewer when cut for a joiner); its
        tokens per request, in order. The core advances by the steps actually run, as the sim does. A
        report of no run in flight (one the node sent before it was marked down and joined again) is stale."""
        node = self.node_id(event["node"])
        stale = "step" in event and int(event["step"]) != self._decode_step[node]
        if stale or not self.core.de_node(node).run_steps:
            return []
        out: Outgoing = [
            (CLIENT, {"type": "tokens", "rid": int(rid), "token_ids": _ids(tokens)})
            for rid, tokens in event.get("tokens", ())
            if int(rid) in self._live
        ]
        for rid, generated, reason in event.get("finished", ()):  # ended inside this run (EOS, stop, cancel)
            self._end_early(int(rid), int(generated), str(reason))
        batch = self.core.decode_batch(node)
        commands = self.core.advance_decode(node, int(event.get("steps", 1)), now_s)
        running = set(self.core.decode_batch(node))
        for rid in batch:
            if rid not in running:
                self._live[rid].times["last_token"] = now_s  # its persists may still run
        return out + self._do(commands, now_s) + self._decode_next(node, now_s)

    # ---- commands -> messages --------------------------------------------------------------------
    def _do(self, commands: list[cmd.Command], now_s: float) -> Outgoing:
        out: Outgoing = []
        changed: list[int] = []
        for c in commands:
            if isinstance(c, cmd.StartRead):
                out.append(self._read(c, now_s))
            elif isinstance(c, cmd.StartPrefillStep):
                out.append(self._step(c, now_s))
            elif isinstance(c, cmd.StartH2D):
                out.append(self._h2d(c))
            elif isinstance(c, cmd.StartPersist):
                out.append(self._persist(c))
            elif isinstance(c, cmd.DecodeChanged):
                if c.node_id not in changed:
                    changed.append(c.node_id)
            elif isinstance(c, cmd.RequestDone):
                out += self._done(c, now_s)
            # TokenMilestone: the token ids themselves come with step_done / decode_done events.
        for node in changed:
            out += self._decode_next(node, now_s)
        return out

    def _end_early(self, rid: int, generated_tokens: int, reason: str) -> None:
        """A node ended the request's output after `generated_tokens` tokens: the core learns it before it
        advances past them (`ClusterCore.finish_early`); a cancelled request stays "abort"."""
        live = self._live.get(rid)
        if live is None:
            return
        if live.finish_reason != "abort":
            live.finish_reason = reason
        self.core.finish_early(rid, generated_tokens)

    def _cancel(self, event: Message, now_s: float) -> Outgoing:
        """End a request wherever it is (the client left, or a stop string matched). In a decode batch its
        DE stops it at the next step boundary and reports it like an EOS; before that its output is cut to
        token 1, which its prefill still computes (no decode follows); queued, it still runs that prefill
        (the policy's queues have no removal). Its last client message says "abort"."""
        rid = int(event["rid"])
        live = self._live.get(rid)
        if live is None:
            return []
        live.finish_reason = "abort"
        view = self.core.view(rid)
        if view is None or view.phase is Phase.DONE:
            return []
        drops = self._drops(rid, view.pe_engine, view.de_engine)
        abandoned = self.core.abandon(rid)
        if abandoned is not None:  # before its prefill: it leaves queues, reads and buffers now
            self._live.pop(rid)
            done = {"type": "done", "rid": rid, "finish_reason": "abort", "cached_tokens": 0}
            return drops + self._do(abandoned, now_s) + [(CLIENT, done)]
        if view.de_engine is not None and rid in self.core.decode_batch(
            self.core.node_of_engine(view.de_engine)
        ):
            return [(self._de_name(view.de_engine), {"type": "decode_stop", "rid": rid})]
        self.core.finish_early(rid, max(1, view.generated_tokens))
        return []

    # ---- node failures ---------------------------------------------------------------------------
    def _node_down(self, event: Message, now_s: float) -> Outgoing:
        """A node died or went silent (the scheduler process saw its exit or missed its reports). The
        core re-plans (`ClusterCore.on_node_down`); the surviving nodes drop what they hold for those
        requests; each goes to the client side as `replan` (its continuation is submitted there, with
        the tokens the client already has)."""
        name = str(event["node"])
        if name in self._down:
            return []
        node = self.node_id(name)
        self._down.add(name)
        decision = self.core.on_node_down(node)
        if node in self._cut_sent:
            self._cut_sent[node] = False
        out: Outgoing = [
            d for r in decision.replan for d in self._drops(r.request_id, r.pe_engine, r.de_engine)
        ]
        for request in decision.replan:
            live = self._live.pop(request.request_id)
            out.append(
                (CLIENT, {"type": "replan", "rid": request.request_id, "first_token": live.first_token})
            )
        return out + self._do(list(decision.commands), now_s)

    def _node_up(self, event: Message, now_s: float) -> Outgoing:
        name = str(event["node"])
        self._down.discard(name)
        node = self.node_id(name)
        if node in self._cut_sent:
            self._cut_sent[node] = False
        return self._do(self.core.on_node_up(node), now_s)

    def _drops(self, rid: int, pe_engine: int | None, de_engine: int | None) -> Outgoing:
        """`drop` to the nodes that may hold the request's reads, regions or landing space."""
        names = {self.node_name(self.core.node_of_engine(e)) for e in (pe_engine, de_engine) if e is not None}
        return [(n, {"type": "drop", "rid": rid}) for n in sorted(names - self._down)]

    @property
    def nodes_up(self) -> tuple[int, int]:
        """(PE nodes up, DE nodes up)."""
        return self.core.nodes_up

    def _de_name(self, de_engine: int | None) -> str:
        assert de_engine is not None
        return self.node_name(self.core.node_of_engine(de_engine))

    def _read(self, c: cmd.StartRead, now_s: float) -> tuple[str, Message]:
        live = self._live[c.request_id]
        live.times.setdefault("read_start", now_s)
        message = {
            "type": "read",
            "rid": c.request_id,
            "token_ids": live.token_ids[: c.start_tokens + c.tokens],
            "start_tokens": c.start_tokens,
            "tokens": c.tokens,
            "side": "pe" if c.pe_side else "de",
            "prompt_tokens": c.prompt_tokens,
        }
        return self.node_name(c.node_id), message

    def _step(self, c: cmd.StartPrefillStep, now_s: float) -> tuple[str, Message]:
        items = []
        for batch in c.batches:
            for it in batch:
                live = self._live[it.request_id]
                live.times.setdefault("prefill_start", now_s)
                items.append(
                    {
                        "rid": it.request_id,
                        "pe_engine": it.pe_engine,
                        "de": self._de_name(it.de_engine),
                        "token_ids": live.token_ids,
                        "cached_tokens": it.cached_tokens,
                        "new_tokens": it.new_tokens,
                        "hit_tokens": it.hit_tokens,
                        "pe_read_tokens": it.pe_read_tokens,
                        "de_read_tokens": it.de_read_tokens,
                        "load_pe_tokens": it.load_pe_tokens,
                        "load_de_tokens": it.load_de_tokens,
                        "out_tokens": it.out_tokens,
                        "completes_prefill": it.completes_prefill,
                        "inline_io": self.core.mode.skip_io,
                        "max_tokens": it.gen_tokens,
                        "sampling": live.sampling,
                    }
                )
        message = {"type": "step", "step_id": c.step_id, "layerwise": c.layerwise, "items": items}
        return self.node_name(c.node_id), message

    def _h2d(self, c: cmd.StartH2D) -> tuple[str, Message]:
        live = self._live[c.request_id]
        message = {
            "type": "h2d",
            "rid": c.request_id,
            "de_engine": c.de_engine,
            "tokens": c.tokens,
            "token_ids": live.token_ids,
            "first_token": live.first_token,
            "hit_tokens": c.hit_tokens,
        }
        return self._de_name(c.de_engine), message

    def _persist(self, c: cmd.StartPersist) -> tuple[str, Message]:
        message = {
            "type": "persist",
            "rid": c.request_id,
            "tokens": c.tokens,
            "start_tokens": c.start_tokens,
            "end_tokens": c.end_tokens,
            "from_hbm": c.from_hbm,
            "token_ids": [] if c.from_hbm else self._live[c.request_id].token_ids,
        }
        return self._de_name(c.de_engine), message

    def _decode_next(self, node: int, now_s: float) -> Outgoing:
        """The DE node's batch changed or its run ended: with a run in flight, a `decode_cut` when the core
        wants one (`decode_cut_wanted`: a joiner waits); else the next run as the core sets it
        (`start_decode_run`: joiners merge, its length)."""
        if self.core.de_node(node).run_steps:
            if not self.core.decode_cut_wanted(node) or self._cut_sent[node]:
                return []
            self._cut_sent[node] = True
            return [(self.node_name(node), {"type": "decode_cut", "step": self._decode_step[node]})]
        joining = self.core.decode_joiners(node)
        steps = self.core.start_decode_run(node)
        if not steps:
            return []
        self._cut_sent[node] = False
        self._decode_step[node] += 1
        joins = []
        for r in joining:
            live = self._live[r.request_id]
            live.times["decode_start"] = now_s
            joins.append({"rid": r.request_id, "token_ids": live.token_ids, "first_token": live.first_token,
                          "hit_tokens": r.hit_tokens, "max_tokens": r.gen_tokens,
                          "sampling": live.sampling})  # fmt: skip
        message = {
            "type": "decode_step",
            "step": self._decode_step[node],
            "steps": steps,
            "batch": list(self.core.decode_batch(node)),
            "join": joins,
            "inline_io": self.core.mode.skip_io,
        }
        return [(self.node_name(node), message)]

    def _done(self, c: cmd.RequestDone, now_s: float) -> Outgoing:
        live = self._live.pop(c.request_id)
        live.times["finished"] = now_s
        info = {
            "finish_reason": live.finish_reason,
            "hit_tokens": live.planned_hit_tokens,
            "effective_hit_tokens": c.hit_tokens,
            # the prompt tokens whose KV came from the store (usage.prompt_tokens_details.cached_tokens)
            "cached_tokens": c.hit_tokens,
            "read_side": _read_side(c),
            "pe": c.pe_engine,
            "de": c.de_engine,
            "times_s": {k: v - live.times["arrival"] for k, v in sorted(live.times.items())},
        }
        release: Message = {"type": "release", "rid": c.request_id}
        done: Message = {"type": "done", "rid": c.request_id, **info}
        return [(self._de_name(c.de_engine), release), (CLIENT, done)]

    # ---- inspection --------------------------------------------------------------------------------
    @property
    def active_requests(self) -> int:
        return len(self._live)

    def usable_hit_tokens(self, rid: int) -> int | None:
        """The request's hit prefix that its reads brought intact (None once it is done)."""
        view = self.core.view(rid) if rid in self._live else None
        return None if view is None else view.hit_tokens

    def phase(self, rid: int) -> Phase | None:
        view = self.core.view(rid) if rid in self._live else None
        return None if view is None else view.phase


def _ids(tokens: int | list[int]) -> list[int]:
    """A run's tokens for one request: a list, or one int (a one-step `decode_done`)."""
    return [int(t) for t in tokens] if isinstance(tokens, list) else [int(tokens)]


def _read_side(done: cmd.RequestDone) -> str:
    if done.hit_tokens == 0:
        return "none"
    side = ReadSide.DE if done.de_read_tokens > done.pe_read_tokens else ReadSide.PE
    return side.value
