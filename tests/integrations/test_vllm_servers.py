"""What `vllm_server` leaves behind once its process is stopped (without vLLM: the cleanup step alone)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from dualpath.integrations.vllm.config import ConnectorConfig
from dualpath.integrations.vllm.servers import _remove_notice_sockets
from dualpath.transfer.shm_backend import default_ipc_address


def _socket_file(namespace: str, endpoint: str) -> Path:
    return Path(default_ipc_address(namespace, endpoint).removeprefix("ipc://"))


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the ipc socket files live
    return tmp_path


def test_a_stopped_servers_notice_sockets_are_removed_and_no_other(temp_dir: Path) -> None:
    own = [_socket_file("t1", "p0"), _socket_file("t1", "e0")]
    others = [_socket_file("t1", "p1"), _socket_file("t2", "p0")]  # another server's, another namespace's
    for path in own + others:
        path.touch()
    extra = {"store_dir": "kv", "namespace": "t1", "endpoint": "p0", "de_serve_endpoint": "e0"}
    _remove_notice_sockets(ConnectorConfig.from_extra(extra))
    assert sorted(temp_dir.iterdir()) == sorted(others)


def test_tcp_endpoints_leave_no_socket_file_to_remove(temp_dir: Path) -> None:
    path = _socket_file("t1", "p0")
    path.touch()
    extra = {"store_dir": "kv", "namespace": "t1", "endpoint": "p0", "transport": "tcp"}
    _remove_notice_sockets(ConnectorConfig.from_extra(extra))
    assert path.exists()
