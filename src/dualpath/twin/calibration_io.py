"""Timing the runtime's data movers: emulated NICs, the shared-memory backend, the control plane, DRAM
copies and the `FileStore` (paper §4.1 hops as the runtime runs them; an emulation, not hardware).

Sizes are the runtime's own units: a Layer Block (`block_tokens` rows of one layer), a Full Block (all
layers), and a request's layer (many blocks, one layerwise transfer, `runtime/prefill.py`).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from dualpath.kvcache import FileStore
from dualpath.runtime.control import dealer, decode, encode
from dualpath.transfer import RateLimiter, SharedMemoryBackend, TrafficClass
from dualpath.twin.calibration import Tick

# FileStore capacity for the calibration directory: far above what is written, so nothing is evicted.
_STORE_CAPACITY_BYTES = 1 << 40
# A node's periodic report is a small JSON dict of this order (runtime/node.py `load()`); the control
# round trip is timed with one of this size.
_REPORT_MESSAGE = {
    "type": "report",
    "name": "p0",
    "seq": 3,
    "tok": 4096,
    "read_q_tokens": 512,
    "known": [1, 2, 3],
}


@dataclass(frozen=True, kw_only=True)
class SizedTimes:
    """One sample per operation: its size in bytes and how long it took."""

    sizes_bytes: tuple[int, ...]
    times_s: tuple[float, ...]

    def to_dict(self) -> dict[str, list[float]]:
        return {"sizes_bytes": [float(s) for s in self.sizes_bytes], "times_s": list(self.times_s)}

    @staticmethod
    def from_dict(d: Mapping[str, Sequence[float]]) -> SizedTimes:
        return SizedTimes(
            sizes_bytes=tuple(int(s) for s in d["sizes_bytes"]), times_s=tuple(float(t) for t in d["times_s"])
        )


def _sample(
    sizes: Sequence[int], repeats: int, op: Callable[[int, int], None], tick: Tick, label: str
) -> SizedTimes:
    out_sizes, out_times = [], []
    for size in sizes:
        tick(f"{label} {size} B")
        op(size, -1)  # warm-up
        for i in range(repeats):
            start = time.perf_counter()
            op(size, i)
            out_times.append(time.perf_counter() - start)
            out_sizes.append(size)
    return SizedTimes(sizes_bytes=tuple(out_sizes), times_s=tuple(out_times))


def measure_link(
    rate_bytes_per_s: float, sizes: Sequence[int], repeats: int, tick: Tick, label: str
) -> SizedTimes:
    """`RateLimiter.transmit` on an idle emulated link (KV class, as every KV transfer in the runtime)."""
    limiter = RateLimiter(rate_bytes_per_s, name=label)
    return _sample(sizes, repeats, lambda size, _: limiter.transmit(size, TrafficClass.LOW), tick, label)


def measure_shm_write(sizes: Sequence[int], repeats: int, tick: Tick) -> tuple[SizedTimes, list[float]]:
    """One-sided write + completion notice through `SharedMemoryBackend` (writer call to the receiver's
    notice), and the round trip of two data-less notices (a request and its answer, e.g. pull/hit_layer)."""
    namespace = f"cal{os.getpid()}"
    sender = SharedMemoryBackend("cal_tx", namespace=namespace)
    receiver = SharedMemoryBackend("cal_rx", namespace=namespace)
    try:
        receiver.register_buffer("dram", max(sizes))
        sender.register_buffer("dram", max(sizes))
        sender.add_peer("cal_rx", receiver.address)
        receiver.add_peer("cal_tx", sender.address)
        payload = memoryview(np.random.default_rng(0).integers(0, 256, max(sizes), dtype=np.uint8).tobytes())

        def write(size: int, i: int) -> None:
            sender.write("cal_rx", "dram", 0, payload[:size], {"kind": "kv_layer", "i": i})
            if receiver.recv_notice(10.0) is None:
                raise RuntimeError("no completion notice within 10 s")

        writes = _sample(sizes, repeats, write, tick, "shm write")
        tick("notice round trip")
        round_trips = []
        for i in range(repeats * 4 + 1):
            start = time.perf_counter()
            sender.notify("cal_rx", {"kind": "pull", "i": i})
            receiver.recv_notice(10.0)
            receiver.notify("cal_tx", {"kind": "de_ready", "i": i})
            sender.recv_notice(10.0)
            round_trips.append(time.perf_counter() - start)
        return writes, round_trips[1:]
    finally:
        sender.close()
        receiver.close()


def measure_control_round_trip(repeats: int, tick: Tick) -> tuple[list[float], float]:
    """A report over ZeroMQ DEALER → ROUTER and its answer back (the runtime's control plane, TCP loopback).

    Returns the wall time of each round trip and the process CPU per round trip (both ends are here;
    ZeroMQ's I/O thread included) over all of them.
    """
    tick("control round trip")
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    node = dealer(context, f"tcp://127.0.0.1:{port}", "p0")
    try:
        samples = []
        cpu_start = 0.0
        for i in range(repeats * 4 + 1):
            if i == 1:  # after the warm-up round trip
                cpu_start = time.process_time()
            start = time.perf_counter()
            node.send(encode(_REPORT_MESSAGE))
            identity, frame = router.recv_multipart()
            router.send_multipart([identity, encode({"type": "ack", "seen": decode(frame)["seq"]})])
            decode(node.recv())
            samples.append(time.perf_counter() - start)
        return samples[1:], (time.process_time() - cpu_start) / (len(samples) - 1)
    finally:
        node.close(0)
        router.close(0)
        context.term()


def measure_memcpy_bytes_per_s(nbytes: int, repeats: int, tick: Tick) -> float:
    """DRAM rate as the simulator counts it: half-duplex, so a copy of N bytes is 2N (read + write)."""
    tick("memcpy")
    src = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(samples)


@dataclass(frozen=True, kw_only=True)
class StoreTimes:
    write: SizedTimes  # atomic `put_full_block` (temp file, fsync, rename, fsync dir)
    read: SizedTimes  # `read_layer_block_into` (one pread) and `read_full_block_into`, checksummed


def measure_file_store(*, num_layers: int, layer_block_bytes: Sequence[int], repeats: int, tick: Tick,
                       directory: Path | None = None) -> StoreTimes:  # fmt: skip
    """Writes and reads of Full Blocks whose Layer Blocks have the given sizes (page-cache warm reads, as a
    block written by a DE and read back in the next round is)."""
    rng = np.random.default_rng(2)
    with tempfile.TemporaryDirectory(prefix="dualpath-calibrate-", dir=directory) as folder:
        store = FileStore(Path(folder), capacity_bytes=_STORE_CAPACITY_BYTES)
        keys: dict[int, list[bytes]] = {}
        w_sizes, w_times, r_sizes, r_times = [], [], [], []
        for lb_bytes in layer_block_bytes:
            tick(f"store write {lb_bytes * num_layers} B")
            data = rng.integers(0, 256, lb_bytes * num_layers, dtype=np.uint8).tobytes()
            keys[lb_bytes] = []
            for _ in range(repeats + 1):
                key = rng.bytes(16)
                start = time.perf_counter()
                store.put_full_block(key, data, num_layers=num_layers)
                elapsed = time.perf_counter() - start
                if keys[lb_bytes]:  # the first write per size pays directory creation: warm-up
                    w_sizes.append(len(data))
                    w_times.append(elapsed)
                keys[lb_bytes].append(key)
        for lb_bytes, block_keys in keys.items():
            tick(f"store read {lb_bytes} B")
            out = memoryview(bytearray(lb_bytes * num_layers))
            store.read_full_block_into(block_keys[0], out)  # warm-up
            for key in block_keys[1:]:
                for layer, size in ((num_layers // 2, lb_bytes), (None, lb_bytes * num_layers)):
                    start = time.perf_counter()
                    if layer is None:
                        store.read_full_block_into(key, out)
                    else:
                        store.read_layer_block_into(key, layer, out[:size])
                    r_times.append(time.perf_counter() - start)
                    r_sizes.append(size)
    return StoreTimes(
        write=SizedTimes(sizes_bytes=tuple(w_sizes), times_s=tuple(w_times)),
        read=SizedTimes(sizes_bytes=tuple(r_sizes), times_s=tuple(r_times)),
    )
