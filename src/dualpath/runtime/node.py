"""One node process: its engine (PE or DE), DRAM buffer, emulated SNIC with read queue, and CNIC.

    scheduler ◄──DEALER (hello, report = fetch, tokens, finished)──► main thread
    peers     ◄──transfer backend (one-sided writes + notices)────► notice thread ─► engine
    storage   ◄──StorageReader/Writer paced by the SNIC (rx reads, tx persists)

Threads: the main thread owns the control socket; one thread consumes transfer notices; the engine runs
its own worker threads. Other threads hand control messages to `NodeLinks.send`, which gives each thread
its own DEALER (ZeroMQ sockets are not thread-safe).

Bandwidths are EMULATED (brief §3): the SNIC and the engine's CNIC are `dualpath.transfer` rate
limiters. In `oracle` mode links are unpaced (`_UNPACED_BYTES_PER_S`), so I/O takes ≈ no time.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import zmq

from dualpath.engine.modes import Mode, get_mode
from dualpath.kvcache import FileStore
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.runtime.control import Message, dealer, recv_all, send
from dualpath.runtime.dram import DramBuffer, Region
from dualpath.runtime.model.transformer import Transformer
from dualpath.runtime.model_host import (
    build_model,
    measure_attention_s_per_token_pair,
    measure_prefill_tokens_per_s,
    served_model_name,
)
from dualpath.runtime.persist import PipelinedWriter
from dualpath.transfer import (
    EmulatedNic,
    PacedBackend,
    SharedMemoryBackend,
    Snic,
    StorageReader,
)
from dualpath.transfer.types import Notice

# Oracle (paper §7.1): every storage read, H2D/D2H and PD transfer is skipped in time. A limiter 10^6x
# faster than the emulated links makes their time negligible while the bytes still move (outputs stay exact).
_UNPACED_BYTES_PER_S = 1e15
_ALLOC_RETRY_S = 0.005  # poll interval while the DRAM buffer has no contiguous room (allocate_region)
_REPORT_INTERVAL_S = 0.02  # node leaders fetch every 20 ms: short next to one request's read (~100 ms)
_SWITCH_INTERVAL_S = 0.0005  # 10x shorter than CPython's default 5 ms
DISK_FULL_SWITCH = ".dualpath-disk-full"  # fault injection: while this file is in the store, writes fail
_STORE_CAPACITY_BYTES = 2**40  # the shared directory is the whole "3FS"; eviction is not modelled (A.4)


class NodeStartError(RuntimeError):
    """The node cannot start (its model, device or configuration); the message says why, in one line."""


class Engine(Protocol):
    def on_command(self, message: Message) -> None: ...
    def on_notice(self, notice: Notice) -> None: ...
    def load(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, float]: ...
    def close(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class NodeOptions:
    name: str
    role: str
    scheduler_address: str
    store_dir: Path
    namespace: str
    tcp_host: str | None = None  # None: shared memory (one host); else the TCP data plane on this host
    parent_pid: int | None = None  # spawned by `dualpath serve`: exit if that process is gone (no orphans)


class WaitMeter:
    """Seconds during which at least one storage read was waiting or in flight (for SNIC utilisation)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._since = 0.0
        self._total_s = 0.0

    def enter(self) -> None:
        with self._lock:
            if self._open == 0:
                self._since = time.monotonic()
            self._open += 1

    def leave(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open == 0:
                self._total_s += time.monotonic() - self._since

    def total_s(self) -> float:
        with self._lock:
            return self._total_s + (time.monotonic() - self._since if self._open else 0.0)


class NodeLinks:
    """Everything an engine uses to move bytes and messages."""

    def __init__(
        self, options: NodeOptions, spec: RuntimeClusterSpec, mode: Mode, model: Transformer
    ) -> None:
        self.options = options
        self.name = options.name
        self.spec = spec
        self.mode = mode
        self.model = model
        paced = not mode.skip_io
        snic_rate = spec.snic_bytes_per_s if paced else _UNPACED_BYTES_PER_S
        cnic_rate = spec.cnic_bytes_per_s if paced else _UNPACED_BYTES_PER_S
        self.snic = Snic(f"{self.name}.snic", snic_rate)
        self.cnic = EmulatedNic(f"{self.name}.cnic", cnic_rate)
        self.store = FileStore(options.store_dir, capacity_bytes=_STORE_CAPACITY_BYTES)
        self.reader = StorageReader(self.store, self.snic)
        # link time overlapped with commits; DISK_FULL_SWITCH in the store fails writes as a full disk would
        self.writer = PipelinedWriter(self.store, self.snic, full_switch=options.store_dir / DISK_FULL_SWITCH)
        self.read_wait = WaitMeter()
        if options.tcp_host is not None:
            from dualpath.transfer import TcpBackend

            raw: Any = TcpBackend(self.name, host=options.tcp_host)
        else:
            raw = SharedMemoryBackend(self.name, namespace=options.namespace)
        self.raw = raw
        self.link = PacedBackend(raw, self.cnic)  # KV writes to peers go out through this engine's CNIC
        self.dram_view = raw.register_buffer("dram", spec.dram_buffer_bytes)
        self.dram = DramBuffer(spec.dram_buffer_bytes)
        self.corrupt_blocks = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._context = zmq.Context.instance()
        self._events: queue.Queue[Message | None] = queue.Queue()
        self._emitter = threading.Thread(target=self._emit_loop, name="events", daemon=True)
        self._emitter.start()

    @property
    def block_tokens(self) -> int:
        return self.spec.block_tokens

    @property
    def row_bytes(self) -> int:
        return self.model.config.kv_bytes_per_token_per_layer

    def allocate_region(self, tokens: int) -> Region:
        """A DRAM-buffer region for `tokens` rows of every layer; waits while the buffer says "not now"
        (the core admitted the bytes, §6.2, but a fragmented free list can still refuse for a moment)."""
        layers = self.model.config.num_layers
        while (
            region := self.dram.allocate(
                num_layers=layers, tokens=tokens, bytes_per_token_per_layer=self.row_bytes
            )
        ) is None:
            threading.Event().wait(_ALLOC_RETRY_S)
        return region

    def count_corrupt(self, n: int) -> None:
        with self._lock:
            self.corrupt_blocks += n

    def send(self, message: Message) -> None:
        """Send a control message to the scheduler from any thread (one DEALER per thread)."""
        socket = getattr(self._local, "socket", None)
        if socket is None:
            socket = dealer(
                self._context, self.options.scheduler_address, f"{self.name}/{threading.get_ident()}"
            )
            self._local.socket = socket
        send(socket, message)

    def emit(self, event: Message) -> None:
        """A completion event for the scheduler's `RuntimeDriver`, from any thread.

        One sender thread keeps them in the order they were emitted (a step's `step_done` before its
        `kv_out_done`): the core requires that order, and per-thread sockets would not keep it.
        """
        self._events.put({**event, "node": self.name})

    def _emit_loop(self) -> None:
        while (event := self._events.get()) is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.send(event)

    def stats(self) -> dict[str, float]:
        snic = self.snic.stats()
        return {
            "snic_rx_bytes": float(snic.rx.total_bytes),
            "snic_tx_bytes": float(snic.tx.total_bytes),
            "snic_rx_busy_s": snic.rx.busy_s,
            "snic_tx_busy_s": snic.tx.busy_s,
            "snic_read_wait_s": self.read_wait.total_s(),
            "snic_bytes_per_s": self.snic.rate_bytes_per_s,
            "read_q_tokens": float(self.snic.read_queue.queued_tokens),
            "corrupt_blocks": float(self.corrupt_blocks),
            "store_write_errors": float(self.writer.failures.total),
        }

    def close(self) -> None:
        self._events.put(None)
        self._emitter.join(timeout=2)
        self.reader.close()
        self.writer.close()
        self.raw.close()


def _make_engine(links: NodeLinks) -> Engine:
    if links.options.role == "prefill":
        from dualpath.runtime.pe_executor import PrefillExecutor

        return PrefillExecutor(links)
    from dualpath.runtime.de_executor import DecodeExecutor

    return DecodeExecutor(links)


def _notice_loop(links: NodeLinks, engine: Engine, stop: threading.Event) -> None:
    while not stop.is_set():
        notice = links.raw.recv_notice(0.05)
        if notice is not None:
            engine.on_notice(notice)


def run_node(options: NodeOptions, spec: RuntimeClusterSpec) -> int:
    """The node's main loop: hello, then reports every few ms, until SIGTERM/SIGINT or the scheduler says stop."""
    torch.set_num_threads(1)  # one engine = one "GPU"; the host has few cores to share (brief: 2)
    # I/O threads (SNIC reads, CNIC sends, notices) must get the GIL promptly while the engine computes:
    # the default 5 ms switch interval would idle an emulated link for 5 ms at every handoff.
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        model = build_model(spec.model, device=spec.device, seed=spec.seed, dtype=spec.dtype)
    except Exception as error:  # noqa: BLE001 - any failure here is the start-up failure to report
        why = f"cannot build model {spec.model!r} on device {spec.device!r}: {error}"
        raise NodeStartError(why) from error
    context = zmq.Context.instance()
    control = dealer(context, options.scheduler_address, options.name)
    links: NodeLinks | None = None
    notices: threading.Thread | None = None
    try:
        hello = {
            "type": "hello",
            "name": options.name,
            "role": options.role,
            "pid": os.getpid(),
            "host": socket.gethostname(),  # with pid: the scheduler on the same host sees its exit at once
            "model": served_model_name(spec.model),
            "dtype": model.config.dtype,
            "vocab_size": model.config.vocab_size,
            "max_context_tokens": model.config.max_position_tokens,
            "kv_bytes_per_token": model.config.kv_bytes_per_token_per_layer * model.config.num_layers,
            "hbm_tokens": spec.hbm_tokens,
            "prefill_tokens_per_s": measure_prefill_tokens_per_s(model) if options.role == "prefill" else 0.0,
            "attention_s_per_token_pair": (
                measure_attention_s_per_token_pair(model) if options.role == "prefill" else 0.0
            ),
        }
        start = _await_start(control, hello, options, stop)
        if start is None:
            return 0
        links = NodeLinks(options, spec, get_mode(start["mode"]), model)
        engine = _make_engine(links)
        send(control, {"type": "ready", "name": options.name, "address": links.raw.address})
        peers = _await_peers(control, stop)
        for peer, address in (peers or {}).items():
            if peer != options.name:
                links.raw.add_peer(peer, address)
        notices = threading.Thread(
            target=_notice_loop, args=(links, engine, stop), name="notices", daemon=True
        )
        notices.start()
        _main_loop(control, links, engine, stop)
        engine.close()
        return 0
    finally:
        stop.set()
        if notices is not None:  # it polls the transfer endpoint: let it see `stop` before that closes
            notices.join(timeout=1.0)
        if links is not None:
            links.close()
        control.close(0)


def _await_start(
    control: zmq.Socket, hello: Message, options: NodeOptions, stop: threading.Event
) -> Message | None:
    """Say hello (again every second, in case the scheduler started later) until it says start."""
    next_hello = 0.0
    while not stop.is_set() and not _orphaned(options):
        if time.monotonic() >= next_hello:
            send(control, hello)
            next_hello = time.monotonic() + 1.0
        if control.poll(50):
            for message in recv_all(control):
                if message["type"] == "start":
                    return message
                if message["type"] == "reject":
                    raise SystemExit(f"scheduler rejected {hello['name']}: {message['reason']}")
    return None


def _await_peers(control: zmq.Socket, stop: threading.Event) -> dict[str, str] | None:
    while not stop.is_set():
        if control.poll(50):
            for message in recv_all(control):
                if message["type"] == "peers":
                    return dict(message["peers"])
    return None


def _orphaned(options: NodeOptions) -> bool:
    return options.parent_pid is not None and os.getppid() != options.parent_pid


def _main_loop(control: zmq.Socket, links: NodeLinks, engine: Engine, stop: threading.Event) -> None:
    next_report = 0.0
    while not stop.is_set() and not _orphaned(links.options):
        timeout_ms = int(max(0.0, next_report - time.monotonic()) * 1000)
        if control.poll(timeout_ms):
            for message in recv_all(control):
                if message["type"] == "stop":
                    return
                if message["type"] == "peers":  # a node (re)joined: its transfer endpoint is new
                    for peer, address in dict(message["peers"]).items():
                        if peer != links.name:
                            links.raw.add_peer(peer, address)
                    continue
                engine.on_command(message)
        if time.monotonic() >= next_report:
            stats = {**links.stats(), **engine.stats()}
            report = {"type": "report", "name": links.name, **engine.load(), "stats": stats}
            with contextlib.suppress(zmq.ZMQError):
                send(control, report)
            next_report = time.monotonic() + _REPORT_INTERVAL_S
