"""What a node's engine uses to move bytes and messages (`NodeLinks`): its DRAM buffer, emulated SNIC with
read queue and writer, CNIC, transfer backend, and the control messages it sends to the scheduler.

The node process (`runtime/node.py`) builds one and hands it to its engine (`pe_executor`, `de_executor`);
those import this module, never the process entry point.

Bandwidths are EMULATED (brief §3): the SNIC and the engine's CNIC are `dualpath.transfer` rate
limiters. In `oracle` mode links are unpaced (`_UNPACED_BYTES_PER_S`), so I/O takes ≈ no time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from dualpath.engine.modes import Mode
from dualpath.kvcache import FileStore
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.runtime.control import Message, dealer, send
from dualpath.runtime.dram import DramBuffer, Region
from dualpath.runtime.model.transformer import Transformer
from dualpath.runtime.persist import PipelinedWriter
from dualpath.runtime.spans import Spans, message_keys
from dualpath.transfer import EmulatedNic, PacedBackend, SharedMemoryBackend, Snic, StorageReader

# Oracle (paper §7.1): every storage read, H2D/D2H and PD transfer is skipped in time. A limiter 10^6x
# faster than the emulated links makes their time negligible while the bytes still move (outputs stay exact).
_UNPACED_BYTES_PER_S = 1e15
_ALLOC_RETRY_S = 0.005  # poll interval while the DRAM buffer has no contiguous room (allocate_region)
DISK_FULL_SWITCH = ".dualpath-disk-full"  # fault injection: while this file is in the store, writes fail
_STORE_CAPACITY_BYTES = 2**40  # the shared directory is the whole "3FS"; eviction is not modelled (A.4)


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
        self.spans = Spans.from_env(self.name)  # per-piece timings (off unless profiling)
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
        self.spans.mark("node.emit", **message_keys(event))
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
