"""One node process: its engine (PE or DE), DRAM buffer, emulated SNIC with read queue, and CNIC.

    scheduler ◄──DEALER (hello, report = fetch, tokens, finished)──► main thread
    peers     ◄──transfer backend (one-sided writes + notices)────► notice thread ─► engine
    storage   ◄──StorageReader/Writer paced by the SNIC (rx reads, tx persists)

Threads: the main thread owns the control socket; one thread consumes transfer notices; the engine runs
its own worker threads. Other threads hand control messages to `NodeLinks.send`, which gives each thread
its own DEALER (ZeroMQ sockets are not thread-safe).

This module is the process entry point (`run_node`); what the engines use lives in `node_links.py`, so
the executors never import their importer. Bandwidths are EMULATED (brief §3): see `node_links.py`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Protocol

import torch
import zmq

from dualpath.engine.modes import get_mode
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.runtime.control import Message, dealer, recv_all, send
from dualpath.runtime.de_executor import DecodeExecutor
from dualpath.runtime.model_host import (
    build_model,
    measure_attention_s_per_token_pair,
    measure_prefill_tokens_per_s,
    served_model_name,
)
from dualpath.runtime.node_links import NodeLinks, NodeOptions
from dualpath.runtime.pe_executor import PrefillExecutor
from dualpath.runtime.spans import message_keys
from dualpath.transfer.types import Notice

# A node's statistics report (/metrics, heartbeat). Decisions do not wait for it: the scheduler fetches on its
# own tick. Chosen: 50 ms keeps /metrics fresh within a few reports; at 20 ms the reports took half a node's
# idle CPU and woke the scheduler 150 times a second (benchmarks/README.md, runtime_profile).
_REPORT_INTERVAL_S = 0.05
_SWITCH_INTERVAL_S = 0.0005  # 10x shorter than CPython's default 5 ms


class NodeStartError(RuntimeError):
    """The node cannot start (its model, device or configuration); the message says why, in one line."""


class Engine(Protocol):
    def on_command(self, message: Message) -> None: ...
    def on_notice(self, notice: Notice) -> None: ...
    def load(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, float]: ...
    def close(self) -> None: ...


def _make_engine(links: NodeLinks) -> Engine:
    if links.options.role == "prefill":
        return PrefillExecutor(links)
    return DecodeExecutor(links)


def _notice_loop(links: NodeLinks, engine: Engine, stop: threading.Event) -> None:
    while not stop.is_set():
        notice = links.raw.recv_notice(0.05)
        if notice is not None:
            engine.on_notice(notice)


def stop_from_signal(stop: threading.Event) -> None:
    """Set `stop` from a signal handler without taking its lock on the main thread: the handler runs
    between two bytecodes of the main thread, which may be inside `stop.set()` itself (the node's own
    shutdown) holding that lock, and `Event.set` again there would wait on it for ever (an orphan
    node). A short thread sets it instead, once the main thread lets go."""
    threading.Thread(target=stop.set, name="signal-stop", daemon=True).start()


def run_node(options: NodeOptions, spec: RuntimeClusterSpec) -> int:
    """The node's main loop: hello, then reports every few ms, until SIGTERM/SIGINT or the scheduler says stop."""
    torch.set_num_threads(1)  # one engine = one "GPU"; the host has few cores to share (brief: 2)
    # I/O threads (SNIC reads, CNIC sends, notices) must get the GIL promptly while the engine computes:
    # the default 5 ms switch interval would idle an emulated link for 5 ms at every handoff.
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_from_signal(stop))
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
            links.spans.dump()
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
                links.spans.mark("node.recv", **message_keys(message))
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
