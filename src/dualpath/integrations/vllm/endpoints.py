"""This instance's transfer endpoint and its peers, over shared memory (one host) or TCP (across hosts).

shm  SharedMemoryBackend: a peer's address follows from the namespace and its name
tcp  TcpBackend on host:port: a peer's address comes with its request (`reply_address`) or from the
     configured map (`peers`: "name=tcp://host:port,..."), e.g. a prefill instance's DE readers
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from dualpath.transfer import SharedMemoryBackend, TcpBackend
from dualpath.transfer.shm_backend import default_ipc_address

TRANSPORTS = ("shm", "tcp")
Backend = SharedMemoryBackend | TcpBackend


def make_backend(
    name: str, *, transport: str, namespace: str, host: str = "127.0.0.1", port: int = 0
) -> Backend:
    if transport == "tcp":
        return TcpBackend(name, host=host, port=port)
    if transport == "shm":
        return SharedMemoryBackend(name, namespace=namespace)
    raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")


def parse_peers(text: str) -> dict[str, str]:
    """ "d0=tcp://10.0.0.7:7100,d1=tcp://10.0.0.8:7100" -> {"d0": ..., "d1": ...}"""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise ValueError(f"peers: expected name=address, got {item!r}")
        out[name.strip()] = address.strip()
    return out


class Peers:
    """The peers an endpoint writes to, connected on first use."""

    def __init__(self, backend: Backend, namespace: str, addresses: Mapping[str, str] | None = None) -> None:
        self.backend, self.namespace = backend, namespace
        self.addresses = dict(addresses or {})
        self._connected: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, address: str | None = None) -> str:
        """The peer's name, connected at `address`, else at the configured one, else (shm) the derived one."""
        with self._lock:
            target = address or self.addresses.get(name) or self._connected.get(name)
            if target is None:
                if not isinstance(self.backend, SharedMemoryBackend):
                    raise KeyError(f"no address for peer {name!r}: add it to the connector's 'peers'")
                target = default_ipc_address(self.namespace, name)
            if self._connected.get(name) != target:
                self.backend.add_peer(name, target)
                self._connected[name] = target
        return name
