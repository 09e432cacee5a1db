"""The scheduler process: the HTTP API plus `RuntimeDriver`, which runs the decision core `ClusterCore`.

NOTE: one policy, two drivers (DESIGN §2). Every placement, read, batch, H2D, persist and decode step is
decided by `engine.ClusterCore` through `runtime.driver.RuntimeDriver`, exactly as the simulator drives it;
this file only moves messages: node completion events in, the driver's node messages out, token chunks
to the HTTP streams. Group fetches are coalesced: one after each drained batch of incoming messages (and
after each arrival) when the driver says one is due, plus a periodic tick (§6.1 "periodically").

    HTTP ──submit──► RuntimeDriver(ClusterCore) ◄── read_done / step_done / kv_out_done / h2d_done /
                          │                            persist_done / decode_done   (node events)
                          └── read / step / h2d / persist / decode_step / release ──► nodes
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from dualpath.kvcache import FileStore, block_keys
from dualpath.protocol.errors import ProtocolError
from dualpath.request import hit_tokens_for
from dualpath.runtime.api import CompletionRequest, TokenChunk
from dualpath.runtime.cluster import ClusterConfigError, RuntimeClusterSpec
from dualpath.runtime.control import Message, decode, encode
from dualpath.runtime.driver import CLIENT, DriverConfig, RuntimeDriver
from dualpath.runtime.limits import NO_NODE_RETRY_AFTER_S, RequestLimits, ServeLimits
from dualpath.runtime.model_host import model_tokenizer
from dualpath.runtime.prom import ServeMetrics
from dualpath.runtime.sampling import SamplingParams
from dualpath.runtime.spans import Spans, message_keys

_DRIVER_EVENTS = (
    "read_done",
    "step_done",
    "kv_out_done",
    "h2d_done",
    "persist_done",
    "decode_done",
)
# A cluster that cannot hold one request of this size (prompt tokens, max_tokens: the API's default) is
# refused at start. Chosen: a few blocks of prompt, as the smallest useful agent round.
SMALLEST_SERVED_REQUEST = (256, 16)
_DRAM_COPIES = 2  # a read's staging region beside the request's region (see `admission_error`)
_DRAM_ALIGN_SLACK_BYTES = 2 * 64 * 128  # two regions of ≤128 layers aligned to 64 bytes (`dram.py`)
_WATCH_INTERVAL_S = 0.25  # how soon a dead node or a stopped control loop stops `serve`
# A node silent this long (no report; it sends one every 50 ms) is marked down and told to stop. Chosen:
# far above a report's worst delay seen on the 2-core host under load, far below a client's patience.
HEARTBEAT_TIMEOUT_S = 5.0
_EXIT_CHECK_AFTER_S = 0.2  # a node this late with its report is checked for a process exit (same host)
_FETCH_TICK_S = (
    0.02  # periodic fetch when nothing else woke the loop (paper §6.1: leaders fetch periodically)
)


@dataclass
class LiveRequest:
    rid: int
    api: CompletionRequest
    chunks: asyncio.Queue[TokenChunk]
    hit_tokens: int
    first_token_s: float | None = None
    generated: int = 0
    sampling: SamplingParams | None = None  # as the nodes draw (its seed too): a continuation keeps it
    out_ids: list[int] = field(default_factory=list)  # tokens the client has (a continuation's prefix)
    replans: int = 0  # times a node failure made it continue elsewhere


@dataclass
class NodeSlot:
    name: str
    role: str
    hello: Message


class ClusterScheduler:
    """Books of the scheduler process; `handle` consumes one control message and returns replies."""

    def __init__(
        self,
        spec: RuntimeClusterSpec,
        store_dir: Path,
        *,
        mode: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        event_log_path: Path | None = None,
        limits: ServeLimits | None = None,
    ) -> None:
        self.spec = spec
        self.limits = limits or ServeLimits()
        self.mode = mode or spec.mode
        self.expected = spec.node_ids()
        self.nodes: dict[str, NodeSlot] = {}
        self.live: dict[int, LiveRequest] = {}
        self.metrics = ServeMetrics()
        self.store = FileStore(store_dir, capacity_bytes=2**62)
        self.tokenizer = model_tokenizer(spec.model)  # the served model's (a folder's own, or bytes)
        self.driver: RuntimeDriver | None = None
        self.model_info: Message = {}
        self.addresses: dict[str, str] = {}  # transfer endpoints, known once a node says ready
        self.clock = clock
        self.event_log_path = event_log_path
        self.sent: list[tuple[float, list[tuple[str, Message]]]] = []  # with event_log_path: for replays
        self.down: set[str] = set()  # nodes marked down (exit or silence) until they join again
        self.last_report_s: dict[str, float] = {}
        self.join_info: Message = {}  # what `dualpath node` needs to (re)join (serve fills it)
        self.pids: dict[str, int] = {}
        self.spans = Spans.from_env("scheduler")  # per-piece timings (off unless profiling)

    # ---- readiness --------------------------------------------------------------------------------
    def is_ready(self) -> bool:
        return self.driver is not None and len(self.addresses) == len(self.expected)

    def _start_core(self) -> list[tuple[str, Message]]:
        pe = [s for s in self.nodes.values() if s.role == "prefill"]
        info = pe[0].hello
        self.model_info = {
            k: info[k] for k in ("model", "vocab_size", "max_context_tokens", "kv_bytes_per_token")
        }
        refusal = self.admission_error(*SMALLEST_SERVED_REQUEST)
        if refusal is not None:  # stops `serve` (the control loop ends) with the reason
            raise ClusterConfigError(f"the cluster cannot serve even a default request: {refusal}")
        # Every event and decision is kept only for `--event-log` (a replay); a server keeps nothing per request.
        self.driver = RuntimeDriver(self.driver_config(), record=self.event_log_path is not None)
        start = {"type": "start", "mode": self.mode}
        return [(name, start) for name in self.nodes]

    def driver_config(self) -> DriverConfig:
        pe = [s for s in self.nodes.values() if s.role == "prefill"]
        return DriverConfig(
            node_names=tuple(name for name, _ in self.expected),
            num_prefill_nodes=self.spec.num_prefill_nodes,
            engines_per_node=self.spec.engines_per_node,
            mode=self.mode,
            read_path=self.spec.read_path or None,
            block_tokens=self.spec.block_tokens,
            kv_bytes_per_token=float(pe[0].hello["kv_bytes_per_token"]),
            dram_buffer_bytes=float(self.spec.dram_buffer_bytes),
            de_hbm_kv_tokens=self.spec.hbm_tokens,
            pe_hbm_kv_tokens=self.spec.hbm_tokens,
            snic_bytes_per_s=self.spec.snic_bytes_per_s,
            # β and the §6.4 predictor from the slowest PE's measured costs (A.4 "profiled").
            prefill_tokens_per_s=min(float(s.hello["prefill_tokens_per_s"]) for s in pe),
            attention_s_per_token_pair=max(float(s.hello.get("attention_s_per_token_pair", 0.0)) for s in pe),
        )

    # ---- requests ---------------------------------------------------------------------------------
    def submit(self, api: CompletionRequest) -> tuple[LiveRequest, list[tuple[str, Message]]]:
        assert self.driver is not None
        bt = self.spec.block_tokens
        ids = list(api.prompt_token_ids)
        hit_tokens = hit_tokens_for(self.store.hit_blocks(block_keys(ids, bt)) * bt, len(ids), bt)
        now = self.clock()
        sampling = self.request_sampling(api)
        rid, out = self.driver.submit(
            token_ids=ids,
            hit_tokens=hit_tokens,
            max_tokens=api.max_tokens,
            now_s=now,
            sampling=sampling.to_message(),
        )
        live = LiveRequest(rid=rid, api=api, chunks=asyncio.Queue(), hit_tokens=hit_tokens, sampling=sampling)
        self.live[rid] = live
        return live, self._route(now, out) + self.maybe_fetch()

    def unavailable(self) -> str | None:
        """Why nothing can be served now (no PE or no DE up), or None: the API answers 503 with
        Retry-After instead of queueing a request that would wait for a node nobody may restart."""
        if self.driver is None:
            return None
        pe, de = self.driver.nodes_up
        if pe and de:
            return None
        role = "prefill" if not pe else "decode"
        down = ", ".join(sorted(self.down))
        return f"no {role} node is up (down: {down}); retry after {NO_NODE_RETRY_AFTER_S} s"

    def _replan(self, old_rid: int) -> list[tuple[str, Message]]:
        """A node failure took the request's work (`ClusterCore.on_node_down`): it continues as a new
        request whose prompt is its prompt + the tokens its client already has, for the rest of its
        budget, drawn with the same seed at the same positions (greedy: the tokens an undisturbed run
        gives). Its KV comes from the store (what was persisted) plus recompute. No PE or no DE up:
        its client gets a 503 now instead of a hang."""
        assert self.driver is not None
        live = self.live.pop(old_rid, None)
        if live is None:
            return []
        left = live.api.max_tokens - len(live.out_ids)
        if left <= 0:
            live.chunks.put_nowait(
                TokenChunk(token_ids=(), finish_reason="length", info={"replans": live.replans})
            )
            return []
        refusal = self.unavailable()
        if refusal is not None:
            live.chunks.put_nowait(TokenChunk(token_ids=(), finish_reason="error", info={"error": refusal}))
            return []
        bt = self.spec.block_tokens
        ids = list(live.api.prompt_token_ids) + live.out_ids
        hit_tokens = hit_tokens_for(self.store.hit_blocks(block_keys(ids, bt)) * bt, len(ids), bt)
        sampling = live.sampling or self.request_sampling(live.api)
        if sampling.min_tokens:
            sampling = replace(sampling, min_tokens=max(0, sampling.min_tokens - len(live.out_ids)))
        now = self.clock()
        rid, out = self.driver.submit(
            token_ids=ids, hit_tokens=hit_tokens, max_tokens=left, now_s=now, sampling=sampling.to_message()
        )
        live.rid = rid
        live.replans += 1
        self.metrics.observe_replanned()
        self.live[rid] = live
        return self._route(now, out)

    def node_down(self, name: str, reason: str) -> list[tuple[str, Message]]:
        """A node died or went silent: mark it down, re-plan its work (the core decides), and tell it to
        stop in case it still runs (a silent node must restart to join again)."""
        if self.driver is None or name in self.down or name not in dict(self.expected):
            return []
        print(f"dualpath serve: node {name} is down ({reason}); its requests continue elsewhere", flush=True)
        self.down.add(name)
        self.metrics.observe_node_state(name, up=False)
        now = self.clock()
        out = self._route(now, self.driver.handle({"type": "node_down", "node": name}, now))
        return [*out, (name, {"type": "stop"})] + self.maybe_fetch()

    def check_heartbeats(self) -> list[tuple[str, Message]]:
        """Nodes silent for HEARTBEAT_TIMEOUT_S are down (once serving began: a node reports from then on)."""
        if not self.is_ready():
            return []
        now = self.clock()
        out: list[tuple[str, Message]] = []
        for name, seen in list(self.last_report_s.items()):
            if name in self.down:
                continue
            if now - seen > HEARTBEAT_TIMEOUT_S:
                out += self.node_down(name, f"no report for {now - seen:.1f} s")
            elif now - seen > _EXIT_CHECK_AFTER_S and not self._alive(name):
                out += self.node_down(name, f"its process (pid {self.pids.get(name)}) is gone")
        return out

    def _alive(self, name: str) -> bool:
        """False when the node runs on this host and its process is gone (a quicker sign than silence)."""
        hello = self.nodes[name].hello
        pid = int(hello.get("pid", 0))
        if hello.get("host") != socket.gethostname() or pid <= 0:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def request_sampling(self, api: CompletionRequest) -> SamplingParams:
        """The request's sampling as the nodes use it: the model's EOS ids, and a fresh random seed when
        the client gave none (then a sampled output is not reproducible, as in vLLM)."""
        sampling = api.sampling
        if api.ignore_eos and not sampling.ignore_eos:
            sampling = replace(sampling, ignore_eos=True)
        return sampling.with_model(eos_token_ids=self.tokenizer.eos_token_ids, seed=secrets.randbits(63))

    def cancel(self, rid: int) -> list[tuple[str, Message]]:
        """End a request early wherever it is (a stop string matched, the client left): its stream ends
        now with finish_reason "abort" and gets nothing more; the cluster frees what it holds as soon as it
        can (a decoding request at its DE's next step boundary). Returns the messages for the nodes."""
        live = self.live.pop(rid, None)
        if live is None or self.driver is None:
            return []
        live.chunks.put_nowait(TokenChunk(token_ids=(), finish_reason="abort", info={"cancelled": True}))
        now = self.clock()
        return self._route(now, self.driver.handle({"type": "cancel", "rid": rid}, now))

    def admission_error(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request could never be served here, or None. Its KV must fit one DE's HBM (prompt and
        output tokens, the DE's paged cache) and, twice, a node's DRAM buffer (a read's staging region
        beside the request's layer-major region, `pe_executor` / `de_executor`). The core admits a
        request larger than a pool alone (`CapacityPool`); the nodes' allocators would wait forever."""
        hbm_tokens = self.spec.hbm_tokens
        if prompt_tokens + max_tokens > hbm_tokens:
            return (
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds a decode engine's KV "
                f"capacity of {hbm_tokens} tokens (hbm_tokens)"
            )
        per_token = float(self.model_info.get("kv_bytes_per_token", 0.0))
        need = _DRAM_COPIES * prompt_tokens * per_token + _DRAM_ALIGN_SLACK_BYTES
        if per_token and need > self.spec.dram_buffer_bytes:
            return (
                f"the prompt's KV ({prompt_tokens} tokens x {per_token:.0f} B, held twice while it is read) "
                f"does not fit a node's DRAM buffer of {self.spec.dram_buffer_bytes} bytes (dram_buffer_bytes)"
            )
        return None

    def queue_full(self) -> bool:
        """As many requests wait for placement as the limit allows (the API answers 429)."""
        return self.driver is not None and self.driver.core.scheduler.waiting >= self.limits.max_waiting

    def _on_read_done(self, now: float, message: Message) -> list[tuple[str, Message]]:
        """A read's report; when it found blocks of the hit corrupt or missing, they leave this index at
        once (the next request's hit stops before them) and are counted. The request recomputes them and
        its persist writes them again (`ClusterCore.on_hit_lost`)."""
        assert self.driver is not None
        rid = int(message["rid"])
        before = self.driver.usable_hit_tokens(rid)
        out = self._route(now, self.driver.handle(message, now))
        after = self.driver.usable_hit_tokens(rid)
        live = self.live.get(rid)
        if before is not None and after is not None and after < before and live is not None:
            bt = self.spec.block_tokens
            lost = block_keys(list(live.api.prompt_token_ids[:before]), bt)[after // bt :]
            for key in lost:
                self.store.forget(key)
            self.metrics.observe_lost_blocks(len(lost))
        return out

    def maybe_fetch(self) -> list[tuple[str, Message]]:
        """The coalesced group fetch, when the driver says one is due."""
        if self.driver is None or not self.is_ready() or not self.driver.wants_fetch:
            return []
        with self.spans.span("sched.fetch"):
            now = self.clock()
            return self._route(now, self.driver.handle({"type": "fetch"}, now))

    def _route(self, now: float, out: list[tuple[str, Message]]) -> list[tuple[str, Message]]:
        """Client-bound messages go to the HTTP streams here; the rest are returned for the nodes."""
        if self.event_log_path is not None:
            self.sent.append((now, out))
        nodes = []
        for dest, message in out:
            if dest == CLIENT:
                self.spans.mark(
                    "sched.chunk", **message_keys(message), tokens=len(message.get("token_ids", ()))
                )
                nodes += self._to_client(message)
            elif dest not in self.down or message["type"] == "stop":
                self.spans.mark("sched.send", node=dest, **message_keys(message))
                nodes.append((dest, message))
        return nodes

    # ---- control messages -------------------------------------------------------------------------
    def handle(self, name: str, message: Message) -> list[tuple[str, Message]]:
        kind = message["type"]
        if kind in _DRIVER_EVENTS:
            if self.driver is None:
                return []
            self.spans.mark("sched.recv", **message_keys(message), node=message.get("node"))
            with self.spans.span("sched.event", msg=kind):
                now = self.clock()
                if kind == "read_done":
                    return self._on_read_done(now, message)
                return self._route(now, self.driver.handle(message, now))
        if kind == "hello":
            return self._on_hello(name, message)
        if kind == "report":
            self._on_report(message)
        elif kind == "ready":
            return self._on_ready(message)
        return []

    def _on_hello(self, name: str, message: Message) -> list[tuple[str, Message]]:
        roles = dict(self.expected)
        if roles.get(name) != message["role"]:
            reason = f"{name!r} is not a {message['role']} node of {self.spec.name}"
            return [(name, {"type": "reject", "reason": reason})]
        out: list[tuple[str, Message]] = []
        if self.driver is not None and name not in self.down and name in self.addresses:
            out += self.node_down(name, "it restarted")  # its old process is gone with its work
            out = [m for m in out if m != (name, {"type": "stop"})]
        self.nodes[name] = NodeSlot(name=name, role=message["role"], hello=message)
        self.pids[name] = int(message.get("pid", 0))
        if self.driver is not None:  # a node that (re)joined after the start
            return [*out, (name, {"type": "start", "mode": self.mode})]
        if len(self.nodes) == len(self.expected):
            return self._start_core()
        return []

    def _on_ready(self, message: Message) -> list[tuple[str, Message]]:
        """Once every node has its transfer endpoint up, tell everyone where the others are."""
        name = str(message["name"])
        self.addresses[name] = message["address"]
        self.last_report_s[name] = self.clock()
        if len(self.addresses) < len(self.expected):
            return []
        peers = {"type": "peers", "peers": dict(sorted(self.addresses.items()))}
        out = [(n, peers) for n in self.nodes if n not in self.down or n == name]
        if len(out) == len(self.expected):  # serving begins: nodes report from now on
            self.last_report_s = dict.fromkeys(self.addresses, self.clock())
            for node in self.addresses:
                self.metrics.observe_node_state(node, up=True)
        if name in self.down and self.driver is not None:  # it joined again: placed on from now on
            self.down.discard(name)
            self.metrics.observe_node_state(name, up=True)
            print(f"dualpath serve: node {name} joined again", flush=True)
            now = self.clock()
            out += self._route(now, self.driver.handle({"type": "node_up", "node": name}, now))
            out += self.maybe_fetch()
        return out

    def _on_report(self, message: Message) -> None:
        """Node statistics for /metrics (the core keeps its own loads; reports decide nothing)."""
        name = str(message.get("name", ""))
        if name not in self.nodes:
            return
        if name not in self.down:
            self.last_report_s[name] = self.clock()
        self.nodes[name].hello.setdefault("stats", {})
        self.nodes[name].hello["stats"] = message.get("stats", {})
        self.metrics.observe_node(name, message.get("stats", {}))
        self.metrics.set_corrupt_total(
            sum(int(s.hello.get("stats", {}).get("corrupt_blocks", 0)) for s in self.nodes.values())
        )

    def _to_client(self, message: Message) -> list[tuple[str, Message]]:
        """A chunk for the request's stream; a `replan` submits its continuation (messages returned)."""
        live = self.live.get(int(message["rid"]))
        if live is None:
            return []
        if message["type"] == "replan":
            return self._replan(live.rid)
        now = time.time()
        if message["type"] == "tokens":
            if live.first_token_s is None:
                live.first_token_s = now
            live.generated += len(message["token_ids"])
            live.out_ids += [int(t) for t in message["token_ids"]]
            live.chunks.put_nowait(TokenChunk(token_ids=tuple(message["token_ids"])))
            return []
        del self.live[live.rid]
        first = live.first_token_s or now
        tpot = (now - first) / (live.generated - 1) if live.generated > 1 else None
        self.metrics.observe_request(
            read_side=message["read_side"], ttft_s=first - live.api.arrival_s, tpot_s=tpot
        )
        info = {k: v for k, v in message.items() if k not in ("type", "rid")}
        if live.replans:
            info["replans"] = live.replans
        reason = str(info.get("finish_reason", "length"))
        live.chunks.put_nowait(TokenChunk(token_ids=(), finish_reason=reason, info=info))
        return []

    def write_event_log(self) -> None:
        """The driver's config, input events, outgoing messages and decisions, for a replay."""
        if self.event_log_path is None or self.driver is None:
            return
        record = {
            "config": asdict(self.driver.config),
            "events": self.driver.event_log,
            "sent": self.sent,
            "decisions": [repr(d) for d in self.driver.log.entries],
        }
        self.event_log_path.write_text(json.dumps(record))


class SchedulerBackend:
    """The `CompletionBackend` the HTTP API calls in the scheduler process."""

    def __init__(self, scheduler: ClusterScheduler, router: zmq.asyncio.Socket | None = None) -> None:
        self.scheduler = scheduler
        self.router = router
        self.rids: dict[str, LiveRequest] = {}  # API request id -> its request (latest rid) while it runs
        self.spans: Spans = getattr(scheduler, "spans", None) or Spans("scheduler")  # the API's pieces too
        self.pending: set[asyncio.Task[None]] = set()  # cancel sends in flight (kept from collection)

    async def send(self, out: list[tuple[str, Message]]) -> None:
        if self.router is not None:
            await send_all(self.router, out)

    @property
    def model_name(self) -> str:
        return str(self.scheduler.model_info.get("model", self.scheduler.spec.model))

    @property
    def max_context_tokens(self) -> int:
        return int(self.scheduler.model_info.get("max_context_tokens", 0))

    @property
    def vocab_size(self) -> int:
        return int(self.scheduler.model_info.get("vocab_size", 0))

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.scheduler.tokenizer.encode(text, add_bos=add_special_tokens))

    def chat_token_ids(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """The served model's chat template, then its tokenizer (one BOS whether or not the template has one)."""
        try:
            return list(
                self.scheduler.tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt)
            )
        except Exception as error:  # a template's raise_exception (roles out of order, ...) or a broken one
            raise ValueError(f"the chat template refused them: {error}") from None

    def admission_error(self, prompt_tokens: int, max_tokens: int) -> str | None:
        check = getattr(self.scheduler, "admission_error", None)
        return None if check is None else check(prompt_tokens, max_tokens)

    def cancel(self, request_id: str) -> None:
        """End a request early in the cluster (stop string, client gone); fire and forget."""
        live = self.rids.pop(request_id, None)
        cancel = getattr(self.scheduler, "cancel", None)
        if live is None or cancel is None:
            return
        out = cancel(live.rid)
        if out:
            task = asyncio.get_running_loop().create_task(self.send(list(out)))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.scheduler.tokenizer.decode(token_ids)

    def is_ready(self) -> bool:
        return self.scheduler.is_ready()

    def health_info(self) -> dict[str, Any]:
        info = {**self.scheduler.model_info, "mode": self.scheduler.mode, "cluster": self.scheduler.spec.name}
        driver = self.scheduler.driver
        if driver is not None:  # the scheduler's constants the PEs measured at start-up (A.4 "profiled")
            info["prefill_tokens_per_s"] = driver.config.prefill_tokens_per_s
            info["attention_s_per_token_pair"] = driver.config.attention_s_per_token_pair
            info["active_requests"] = driver.active_requests  # submitted, not yet done (cancels included)
            info["nodes"] = {
                name: {
                    "role": role,
                    "up": name not in self.scheduler.down,
                    "pid": self.scheduler.pids.get(name),
                }
                for name, role in self.scheduler.expected
            }
            info["join"] = self.scheduler.join_info
        return info

    def metrics_text(self) -> bytes:
        return self.scheduler.metrics.text()

    async def generate(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        """The request's chunks; leaving before the last one (a client gone) cancels it in the cluster."""
        unavailable = getattr(self.scheduler, "unavailable", None)
        refusal = None if unavailable is None else unavailable()
        if refusal is not None:
            raise ProtocolError(503, refusal)
        spans = self.spans
        with spans.span("sched.submit", request_id=request.request_id):
            live, out = self.scheduler.submit(request)
        spans.mark(
            "api.submit", rid=live.rid, request_id=request.request_id, tokens=len(request.prompt_token_ids)
        )
        self.rids[request.request_id] = live
        try:
            await self.send(out)
            while True:
                chunk = await self._next_chunk(live, request)
                if chunk.finish_reason is not None:
                    self.rids.pop(request.request_id, None)
                if chunk.finish_reason == "error":  # a node failure left no PE or no DE to continue on
                    raise ProtocolError(503, str(chunk.info.get("error", "no node can continue it")))
                if chunk.finish_reason == "abort" and "cached_tokens" not in chunk.info:
                    # cancelled (a stop string matched): the store hit planned at submission
                    info = {**chunk.info, "cached_tokens": live.hit_tokens}
                    chunk = TokenChunk(
                        token_ids=chunk.token_ids, finish_reason=chunk.finish_reason, info=info
                    )
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            self.cancel(request.request_id)  # no-op once finished

    async def _next_chunk(self, live: LiveRequest, request: CompletionRequest) -> TokenChunk:
        """The next chunk, or a 504 once the request's deadline (`--request-timeout`) passed; leaving
        `generate` then cancels the request in the cluster."""
        timeout_s = self.scheduler.limits.request_timeout_s
        if timeout_s is None:
            return await live.chunks.get()
        left_s = request.arrival_s + timeout_s - time.time()
        try:
            return await asyncio.wait_for(live.chunks.get(), max(0.0, left_s))
        except TimeoutError:
            why = f"the request did not finish within {timeout_s:g} s (--request-timeout); it was cancelled"
            raise ProtocolError(504, why) from None


async def send_all(router: zmq.asyncio.Socket, out: list[tuple[str, Message]]) -> None:
    for name, message in out:
        await router.send_multipart([name.encode(), encode(message)])


async def control_loop(
    scheduler: ClusterScheduler,
    router: zmq.asyncio.Socket,
    node_exits: Callable[[], list[tuple[str, str]]] = lambda: [],
) -> None:
    """Drain what the nodes sent, then one coalesced fetch if due; a periodic tick fetches too. A node
    process that exited (`node_exits`: name, why) or went silent is marked down and its work re-planned."""
    while True:
        for name, why in node_exits():
            await send_all(router, scheduler.node_down(name, why))
        await router.poll(int(_FETCH_TICK_S * 1000))
        while router.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # drained: no failing receive (`recv_all`)
            identity, frame = await router.recv_multipart(zmq.NOBLOCK)
            try:
                name, message = identity.decode(), decode(frame)
            except ValueError:  # not a control message of ours (UnicodeDecodeError is one too)
                continue
            with scheduler.spans.span("sched.message", msg=message.get("type")):
                out = scheduler.handle(name, message)  # a driver error stops serving
            with scheduler.spans.span("sched.send_all", messages=len(out)):
                await send_all(router, out)
        await send_all(router, scheduler.check_heartbeats())
        await send_all(router, scheduler.maybe_fetch())


async def _watch(server: Any, check: Callable[[], str | None]) -> str:
    """Stop serving when `check` names a reason (e.g. a node process died); returns the reason."""
    while (reason := check()) is None:
        await asyncio.sleep(_WATCH_INTERVAL_S)
    print(f"dualpath serve: stopping: {reason}", flush=True)
    server.should_exit = True
    return reason


def _graceful_server(config: Any, on_signal: Callable[[], None]) -> Any:
    """uvicorn's server, except that a second SIGTERM forces the exit as a second SIGINT does (uvicorn
    forces only on SIGINT): the first waits for streams in flight, at most the config's graceful
    shutdown timeout; the second stops waiting. `on_signal` hears of every signal."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_signal()
            if self.should_exit:
                self.force_exit = True
            super().handle_exit(sig, frame)

    return GracefulServer(config)


async def serve_scheduler(
    scheduler: ClusterScheduler,
    *,
    http_host: str,
    http_port: int,
    control_address: str,
    on_bound: Callable[[str], None] | None = None,
    check: Callable[[], str | None] = lambda: None,
    shutdown_grace_s: float | None = None,
    on_signal: Callable[[], None] = lambda: None,
    node_exits: Callable[[], list[tuple[str, str]]] = lambda: [],
) -> str | None:
    """Run the control plane and the HTTP API until uvicorn is asked to stop (SIGINT/SIGTERM: returns
    None) or `check` names a failure (returns it). Requests in flight get `shutdown_grace_s` to finish."""
    import uvicorn

    from dualpath.runtime.api import build_app

    context = zmq.asyncio.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 0)
    router.bind(control_address)
    if on_bound is not None:
        on_bound(str(router.getsockopt_string(zmq.LAST_ENDPOINT)))
    app = RequestLimits(
        build_app(SchedulerBackend(scheduler, router)),
        scheduler.limits,
        scheduler.queue_full,
        scheduler.unavailable,
    )
    server = _graceful_server(
        uvicorn.Config(
            app,
            host=http_host,
            port=http_port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=None if shutdown_grace_s is None else max(0.1, shutdown_grace_s),
        ),
        on_signal,
    )
    control = asyncio.create_task(control_loop(scheduler, router, node_exits))

    def check_all() -> str | None:
        if control.done():  # the driver raised: serving on would hang every request
            error = control.exception() if not control.cancelled() else None
            if isinstance(error, ClusterConfigError):  # a configuration this cluster cannot serve
                return str(error)
            return f"control loop stopped: {error!r}"
        return check()

    watch = asyncio.create_task(_watch(server, check_all))
    tasks = [control, watch]
    try:
        await server.serve()
        return watch.result() if watch.done() else None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # a failure is the reason returned above
        # Nodes this process did not spawn (`dualpath node`, a re-join) stop with it too.
        with contextlib.suppress(zmq.ZMQError):
            await send_all(router, [(name, {"type": "stop"}) for name in scheduler.nodes])
            router.setsockopt(zmq.LINGER, 500)  # let those few bytes leave (at most 0.5 s)
        router.close()
        context.term()
        scheduler.write_event_log()
        scheduler.spans.dump()
