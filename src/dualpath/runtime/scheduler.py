"""The scheduler process: the HTTP API plus the core's `RequestScheduler`, driven by node fetches.

NOTE: the driver loop (paper §6). Every node leader reports its load every `report_interval_s`; each
report is a *fetch*: a DE report runs the two-phase DE assignment (§6.2), a PE report runs Algorithm 1 and
the read-path choice (§6.1, §6.3). Assignments go out as `admit` (to the DE) and `prefill` (to the PE).
All decisions come from `dualpath.policy.RequestScheduler`; this file only keeps books and moves messages.

    HTTP ──submit──► RequestScheduler ◄──report(fetch)── node leaders
                          │ Assignment
                          ├──admit──► DE node        tokens/finished ──► HTTP stream
                          └──prefill─► PE node       first token     ──► HTTP stream

Loads a node has not yet acknowledged (assignments in flight) are added to its report, so two fetches in
quick succession never see the same free HBM twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from dualpath.config.specs import SchedulerSpec
from dualpath.engine.modes import get_mode
from dualpath.kvcache import FileStore, block_keys
from dualpath.policy.decisions import Assignment
from dualpath.policy.read_path import make_read_path_policy
from dualpath.policy.scheduler import RequestScheduler
from dualpath.policy.types import EngineLoad
from dualpath.request import Request
from dualpath.runtime.api import CompletionRequest, TokenChunk
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.runtime.control import Message, decode, encode
from dualpath.runtime.model.tokenizer import ByteTokenizer
from dualpath.runtime.prom import ServeMetrics

_LOAD_KEYS = ("seq", "tok", "read_q_tokens", "free_hbm_tokens")


@dataclass
class LiveRequest:
    request: Request
    api: CompletionRequest
    chunks: asyncio.Queue[TokenChunk]
    read_side: str = "none"
    first_token_s: float | None = None
    generated: int = 0


@dataclass
class NodeSlot:
    node_id: int
    name: str
    role: str
    hello: Message
    report: Message = field(default_factory=dict)
    pending: dict[int, dict[str, int]] = field(default_factory=dict)  # rid -> load not yet reported

    def load(self) -> EngineLoad:
        known = set(self.report.get("known", ()))
        extra = {k: 0 for k in _LOAD_KEYS}
        for rid in [r for r in self.pending if r in known]:
            del self.pending[rid]  # the node counts it itself now
        for delta in self.pending.values():
            for k, v in delta.items():
                extra[k] += v
        base = {k: int(self.report.get(k, 0)) for k in _LOAD_KEYS}
        if not self.report:
            base["free_hbm_tokens"] = int(self.hello.get("hbm_tokens", 0))
        return EngineLoad(
            engine_id=self.node_id,
            node_id=self.node_id,
            seq=base["seq"] + extra["seq"],
            tok=base["tok"] + extra["tok"],
            read_q_tokens=base["read_q_tokens"] + extra["read_q_tokens"],
            free_hbm_tokens=base["free_hbm_tokens"] + extra["free_hbm_tokens"],
        )


class ClusterScheduler:
    """Books of the scheduler process; `handle` consumes one control message and returns replies."""

    def __init__(self, spec: RuntimeClusterSpec, store_dir: Path, *, mode: str | None = None) -> None:
        self.spec = spec
        self.mode = mode or spec.mode
        self.mode_spec = get_mode(self.mode)
        self.read_path = spec.read_path or self.mode_spec.read_path  # "" in the cluster file: the mode's own
        self.expected = spec.node_ids()
        self.nodes: dict[str, NodeSlot] = {}
        self.live: dict[int, LiveRequest] = {}
        self.metrics = ServeMetrics()
        self.store = FileStore(store_dir, capacity_bytes=2**62)
        self.tokenizer = ByteTokenizer()
        self.core: RequestScheduler | None = None
        self._next_id = 0
        self.model_info: Message = {}
        self.addresses: dict[str, str] = {}  # transfer endpoints, known once a node says ready

    # ---- readiness --------------------------------------------------------------------------------
    def is_ready(self) -> bool:
        return self.core is not None and len(self.addresses) == len(self.expected)

    def _start_core(self) -> list[tuple[str, Message]]:
        pe = [s for s in self.nodes.values() if s.role == "prefill"]
        de = [s for s in self.nodes.values() if s.role == "decode"]
        info = pe[0].hello
        self.model_info = {
            k: info[k] for k in ("model", "vocab_size", "max_context_tokens", "kv_bytes_per_token")
        }
        read_tokens_per_s = self.spec.snic_bytes_per_s / info["kv_bytes_per_token"]
        sched_spec = SchedulerSpec(block_tokens=self.spec.block_tokens)
        prefill_tokens_per_s = min(float(s.hello["prefill_tokens_per_s"]) for s in pe)
        self.core = RequestScheduler(
            pe_nodes={s.node_id: [s.node_id] for s in pe},
            de_nodes={s.node_id: [s.node_id] for s in de},
            spec=sched_spec,
            read_path=make_read_path_policy(self.read_path),
            read_tokens_per_s={s.node_id: read_tokens_per_s for s in self.nodes.values()},
            # α, β as Appendix A.4 defines them: tokens read from storage in 3 s, prefilled in 5 s.
            alpha_tokens=sched_spec.alpha_read_s * read_tokens_per_s,
            beta_tokens=sched_spec.beta_compute_s * prefill_tokens_per_s,
            scheduling=self.mode_spec.scheduling,
        )
        start = {"type": "start", "mode": self.mode}
        return [(name, start) for name in self.nodes]

    # ---- requests ---------------------------------------------------------------------------------
    def submit(self, api: CompletionRequest) -> LiveRequest:
        assert self.core is not None
        bt = self.spec.block_tokens
        keys = block_keys(list(api.prompt_token_ids), bt)
        hit_tokens = self.store.hit_blocks(keys) * bt
        if hit_tokens >= len(api.prompt_token_ids):
            hit_tokens -= bt  # at least one prompt token must be computed (it yields the first token)
        request = Request(
            request_id=self._next_id,
            trajectory_id=0,
            round_index=0,
            prompt_tokens=len(api.prompt_token_ids),
            hit_tokens=hit_tokens,
            gen_tokens=api.max_tokens,
            arrival_s=time.monotonic(),
        )
        self._next_id += 1
        live = LiveRequest(request=request, api=api, chunks=asyncio.Queue())
        self.live[request.request_id] = live
        self.core.submit(request)
        return live

    # ---- control messages -------------------------------------------------------------------------
    def handle(self, name: str, message: Message) -> list[tuple[str, Message]]:
        kind = message["type"]
        if kind == "hello":
            return self._on_hello(name, message)
        if kind == "report":
            return self._on_report(name, message)
        if kind == "ready":
            return self._on_ready(message)
        if kind == "tokens":
            self._on_tokens(message)
        elif kind == "finished":
            self._on_finished(name, message)
        return []

    def _on_hello(self, name: str, message: Message) -> list[tuple[str, Message]]:
        roles = dict(self.expected)
        if roles.get(name) != message["role"]:
            return [
                (
                    name,
                    {
                        "type": "reject",
                        "reason": f"{name!r} is not a {message['role']} node of {self.spec.name}",
                    },
                )
            ]
        node_id = [n for n, _ in self.expected].index(name)
        self.nodes[name] = NodeSlot(node_id=node_id, name=name, role=message["role"], hello=message)
        if self.core is not None:  # a node that (re)joined after the start
            return [(name, {"type": "start", "mode": self.mode})]
        if len(self.nodes) == len(self.expected):
            return self._start_core()
        return []

    def _on_ready(self, message: Message) -> list[tuple[str, Message]]:
        """Once every node has its transfer endpoint up, tell everyone where the others are."""
        self.addresses[message["name"]] = message["address"]
        if len(self.addresses) < len(self.expected):
            return []
        peers = {"type": "peers", "peers": dict(sorted(self.addresses.items()))}
        return [(name, peers) for name in self.nodes]

    def _on_report(self, name: str, message: Message) -> list[tuple[str, Message]]:
        slot = self.nodes.get(name)
        if slot is None or self.core is None or not self.is_ready():
            return []
        slot.report = message
        self.metrics.observe_node(name, message.get("stats", {}))
        self.metrics.set_corrupt_total(
            sum(int(s.report.get("stats", {}).get("corrupt_blocks", 0)) for s in self.nodes.values())
        )
        if slot.role == "decode":
            for request, _engine in self.core.fetch_de_group(slot.node_id, [slot.load()]):
                slot.pending[request.request_id] = {
                    "seq": 1,
                    "tok": request.total_tokens,
                    "free_hbm_tokens": -request.total_tokens,
                }
            return []
        return [m for a in self.core.fetch_pe_group(slot.node_id, [slot.load()]) for m in self._dispatch(a)]

    def _slot(self, node_id: int) -> NodeSlot:
        return next(s for s in self.nodes.values() if s.node_id == node_id)

    def _dispatch(self, assignment: Assignment) -> list[tuple[str, Message]]:
        live = self.live[assignment.request_id]
        pe, de = self._slot(assignment.pe_engine), self._slot(assignment.de_engine)
        live.read_side = "none" if live.request.hit_tokens == 0 else assignment.side.value
        pe.pending[assignment.request_id] = {
            "tok": live.request.prompt_tokens,
            "read_q_tokens": assignment.pe_read_tokens,
        }
        de.pending.setdefault(assignment.request_id, {})["read_q_tokens"] = assignment.de_read_tokens
        work = {
            "rid": assignment.request_id,
            "token_ids": list(live.api.prompt_token_ids),
            "hit_tokens": live.request.hit_tokens,
            "pe_read_tokens": assignment.pe_read_tokens,
            "de_read_tokens": assignment.de_read_tokens,
            "max_tokens": live.api.max_tokens,
            "pe": pe.name,
            "de": de.name,
        }
        return [(de.name, {"type": "admit", **work}), (pe.name, {"type": "prefill", **work})]

    def _on_tokens(self, message: Message) -> None:
        now = time.time()
        for rid, ids in message["items"]:
            live = self.live.get(rid)
            if live is None:
                continue
            if live.first_token_s is None:
                live.first_token_s = now
            live.generated += len(ids)
            live.chunks.put_nowait(TokenChunk(token_ids=tuple(ids)))

    def _on_finished(self, name: str, message: Message) -> None:
        live = self.live.pop(message["rid"], None)
        if live is None:
            return
        for slot in self.nodes.values():
            slot.pending.pop(message["rid"], None)
        now = time.time()
        first = live.first_token_s or now
        tpot = (now - first) / (live.generated - 1) if live.generated > 1 else None
        self.metrics.observe_request(read_side=live.read_side, ttft_s=first - live.api.arrival_s, tpot_s=tpot)
        info = {
            "read_side": live.read_side,
            "hit_tokens": live.request.hit_tokens,
            "effective_hit_tokens": message.get("hit_tokens", live.request.hit_tokens),
            "pe": live.request.pe_engine,
            "de": live.request.de_engine,
            # seconds since the request reached the API: assigned, read_end, prefill_start/end, decode_start, ...
            "times_s": {k: v - live.api.arrival_s for k, v in sorted(message.get("times", {}).items())},
        }
        live.chunks.put_nowait(TokenChunk(token_ids=(), finish_reason="length", info=info))


class SchedulerBackend:
    """The `CompletionBackend` the HTTP API calls in the scheduler process."""

    def __init__(self, scheduler: ClusterScheduler) -> None:
        self.scheduler = scheduler

    @property
    def model_name(self) -> str:
        return str(self.scheduler.model_info.get("model", self.scheduler.spec.model))

    @property
    def max_context_tokens(self) -> int:
        return int(self.scheduler.model_info.get("max_context_tokens", 0))

    @property
    def vocab_size(self) -> int:
        return int(self.scheduler.model_info.get("vocab_size", 0))

    def tokenize(self, text: str) -> list[int]:
        return self.scheduler.tokenizer.encode(text)  # byte tokenizer with BOS, as the model's docs define

    def detokenize(self, token_ids: list[int]) -> str:
        return self.scheduler.tokenizer.decode(token_ids)

    def is_ready(self) -> bool:
        return self.scheduler.is_ready()

    def health_info(self) -> dict[str, Any]:
        return {**self.scheduler.model_info, "mode": self.scheduler.mode, "cluster": self.scheduler.spec.name}

    def metrics_text(self) -> bytes:
        return self.scheduler.metrics.text()

    async def generate(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        live = self.scheduler.submit(request)
        while True:
            chunk = await live.chunks.get()
            yield chunk
            if chunk.finish_reason is not None:
                return


async def control_loop(scheduler: ClusterScheduler, router: zmq.asyncio.Socket) -> None:
    while True:
        identity, frame = await router.recv_multipart()
        with contextlib.suppress(ValueError):
            for name, reply in scheduler.handle(identity.decode(), decode(frame)):
                await router.send_multipart([name.encode(), encode(reply)])


async def _watch(server: Any, check: Callable[[], str | None]) -> None:
    """Stop serving when `check` names a reason (e.g. a node process died)."""
    while (reason := check()) is None:
        await asyncio.sleep(0.5)
    print(f"dualpath serve: stopping: {reason}", flush=True)
    server.should_exit = True


async def serve_scheduler(
    scheduler: ClusterScheduler,
    *,
    http_host: str,
    http_port: int,
    control_address: str,
    on_bound: Callable[[str], None] | None = None,
    check: Callable[[], str | None] = lambda: None,
) -> None:
    """Run the control plane and the HTTP API until uvicorn is asked to stop (SIGINT/SIGTERM)."""
    import uvicorn

    from dualpath.runtime.api import build_app

    context = zmq.asyncio.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 0)
    router.bind(control_address)
    if on_bound is not None:
        on_bound(str(router.getsockopt_string(zmq.LAST_ENDPOINT)))
    app = build_app(SchedulerBackend(scheduler))
    server = uvicorn.Server(
        uvicorn.Config(app, host=http_host, port=http_port, log_level="warning", lifespan="off")
    )
    tasks = [asyncio.create_task(control_loop(scheduler, router)), asyncio.create_task(_watch(server, check))]
    try:
        await server.serve()
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        router.close()
        context.term()
