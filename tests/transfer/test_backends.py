import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from dualpath.transfer import (
    EmulatedNic,
    InProcessFabric,
    PacedBackend,
    SharedMemoryBackend,
    TcpBackend,
    TrafficClass,
    TransferSpec,
)

BUFFER_BYTES = 1 << 20


def payload(nbytes: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def _child_writes(kind: str, namespace: str, parent_address: str) -> None:
    """Runs in a spawned process: two one-sided writes into the parent's buffer, each with a notice."""
    backend = SharedMemoryBackend("child", namespace=namespace) if kind == "shm" else TcpBackend("child")
    backend.add_peer("parent", parent_address)
    spec = TransferSpec(
        source="child",
        destination="parent",
        buffer_name="kv",
        offset_bytes=4096,
        nbytes=300_000,
        layer_start=2,
        layer_stop=3,
    )
    backend.write("parent", "kv", 4096, payload(300_000, seed=1), spec.to_notice())
    backend.write("parent", "kv", 100, np.frombuffer(payload(1000, seed=2), dtype=np.uint8), {"step": 2})
    backend.close()


@pytest.fixture(params=["shm", "tcp"])
def node(request):
    """(kind, backend named "parent", namespace); closed even when the test fails (an open ZeroMQ
    context would hang interpreter exit)."""
    if request.param == "shm":
        namespace = f"t{os.getpid()}_{time.monotonic_ns() % 10**9}"
        backend = SharedMemoryBackend("parent", namespace=namespace)
    else:
        backend, namespace = TcpBackend("parent"), ""
    yield request.param, backend, namespace
    backend.close()


def test_write_from_a_spawned_process_lands_byte_exact_with_its_notice(node):
    kind, parent, namespace = node
    buf = parent.register_buffer("kv", BUFFER_BYTES)
    child = mp.get_context("spawn").Process(target=_child_writes, args=(kind, namespace, parent.address))
    child.start()
    try:
        first = parent.recv_notice(timeout_s=30)
        second = parent.recv_notice(timeout_s=10)
    finally:
        child.join(timeout=30)
    assert first is not None and second is not None
    assert (first.src, first.buffer_name, first.offset_bytes, first.nbytes) == ("child", "kv", 4096, 300_000)
    spec = TransferSpec.from_notice(first.payload)
    assert (spec.layer_start, spec.layer_stop, spec.traffic_class) == (2, 3, TrafficClass.LOW)
    assert bytes(buf[4096 : 4096 + 300_000]) == payload(300_000, seed=1)
    assert second.payload == {"step": 2} and bytes(buf[100:1100]) == payload(1000, seed=2)
    assert bytes(buf[:100]) == bytes(100)  # nothing outside the written ranges
    assert child.exitcode == 0


def test_write_to_self_and_notify_within_one_process(node):
    kind, node, _ = node
    node.add_peer("parent", node.address)
    buf = node.register_buffer("kv", 4096)
    node.write("parent", "kv", 10, b"abc", None)
    node.notify("parent", {"free": [1, 2]})
    notice = node.recv_notice(timeout_s=5)
    assert notice is not None and notice.payload == {"free": [1, 2]} and notice.nbytes == 0
    assert bytes(buf[10:13]) == b"abc"
    if kind == "shm":  # the writer maps the peer's buffer, so it checks the range itself
        with pytest.raises(ValueError):
            node.write("parent", "kv", 4095, b"ab", None)
    else:  # over TCP only the receiver knows the buffer: the write is dropped and its notice says why
        node.write("parent", "kv", 4095, b"ab", {"n": 1})
        refused = node.recv_notice(timeout_s=5)
        assert refused is not None and "overruns" in refused.error and bytes(buf[4095:]) == b"\0"


def test_in_process_fabric_write_and_poll():
    fabric = InProcessFabric()
    pe, de = fabric.endpoint("pe"), fabric.endpoint("de")
    buf = de.register_buffer("de_buffer", 64)
    assert de.poll_notices() == []
    pe.write("de", "de_buffer", 8, b"\x01\x02", {"layer": 0})
    notices = de.poll_notices()
    assert [n.payload for n in notices] == [{"layer": 0}] and bytes(buf[8:10]) == b"\x01\x02"
    assert de.recv_notice(timeout_s=0.01) is None


def test_paced_backend_spends_link_time_before_the_bytes_land():
    fabric = InProcessFabric()
    rate = 2_000_000
    cnic = PacedBackend(fabric.endpoint("pe"), EmulatedNic("pe.cnic0", rate))
    de = fabric.endpoint("de")
    buf = de.register_buffer("de_buffer", BUFFER_BYTES)
    data = payload(250_000, seed=3)
    start = time.monotonic()
    cnic.write("de", "de_buffer", 0, data, {"layer": 1}, traffic_class=TrafficClass.LOW)
    elapsed = time.monotonic() - start
    assert elapsed >= (250_000 - cnic.nic.tx.chunk_bytes) / rate
    assert elapsed <= 1.3 * 250_000 / rate + 0.02
    assert de.recv_notice(timeout_s=1) is not None and bytes(buf[:250_000]) == data
    assert cnic.nic.stats().tx.bytes_by_class["LOW"] == 250_000


def test_closing_a_shared_memory_endpoint_removes_its_socket_file():
    """libzmq leaves a bound ipc endpoint's file behind; a run of the tests would litter the temp folder."""
    backend = SharedMemoryBackend("solo", namespace=f"t{os.getpid()}_{time.monotonic_ns() % 10**9}")
    path = backend.address.removeprefix("ipc://")
    assert os.path.exists(path)
    backend.close()
    assert not os.path.exists(path)


def test_cleanup_after_a_killed_node_removes_its_segments_and_socket_files(tmp_path, monkeypatch):
    import tempfile

    from dualpath.runtime.launcher import unlink_shared_memory

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    namespace = f"t{os.getpid()}_{time.monotonic_ns() % 10**9}"
    ours, other = tmp_path / f"dp_{namespace}_p0_notices.sock", tmp_path / "dp_othername_p0_notices.sock"
    ours.touch()
    other.touch()
    assert f"dp_{namespace}_p0_notices.sock" in unlink_shared_memory(namespace)
    assert not ours.exists() and other.exists()
