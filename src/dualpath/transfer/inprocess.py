"""In-process endpoints: the transfer protocol without sockets or processes, for fast tests.

The fabric is an explicit object (no module-level registry): endpoints made from one fabric reach each other.
"""

from __future__ import annotations

import queue
import threading

from dualpath.transfer.backend import Buffer, byte_view, check_range
from dualpath.transfer.types import JsonDict, Notice


class InProcessFabric:
    def __init__(self) -> None:
        self._endpoints: dict[str, InProcessBackend] = {}
        self._lock = threading.Lock()

    def endpoint(self, name: str) -> InProcessBackend:
        with self._lock:
            if name in self._endpoints:
                raise ValueError(f"endpoint {name!r} already exists on this fabric")
            self._endpoints[name] = InProcessBackend(name, self)
            return self._endpoints[name]

    def lookup(self, name: str) -> InProcessBackend:
        with self._lock:
            if name not in self._endpoints:
                raise KeyError(f"no endpoint {name!r} on this fabric")
            return self._endpoints[name]


class InProcessBackend:
    def __init__(self, name: str, fabric: InProcessFabric) -> None:
        self.name = name
        self._fabric = fabric
        self._buffers: dict[str, memoryview] = {}
        self._notices: queue.Queue[Notice] = queue.Queue()

    @property
    def address(self) -> str:
        return f"inproc://{self.name}"

    def register_buffer(self, buffer_name: str, nbytes: int) -> memoryview:
        if buffer_name in self._buffers:
            raise ValueError(f"buffer {buffer_name!r} already registered on {self.name!r}")
        self._buffers[buffer_name] = memoryview(bytearray(nbytes))
        return self._buffers[buffer_name]

    def add_peer(self, peer: str, address: str) -> None:
        """Peers are found through the fabric; the address is not needed."""

    def write(
        self, peer: str, buffer_name: str, offset_bytes: int, data: Buffer, notice: JsonDict | None = None
    ) -> None:
        target = self._fabric.lookup(peer)
        view = byte_view(data)
        buf = target._buffers[buffer_name]
        check_range(buffer_name, buf.nbytes, offset_bytes, view.nbytes)
        buf[offset_bytes : offset_bytes + view.nbytes] = view
        if notice is not None:
            target._notices.put(
                Notice(
                    src=self.name,
                    buffer_name=buffer_name,
                    offset_bytes=offset_bytes,
                    nbytes=view.nbytes,
                    payload=dict(notice),
                )
            )

    def notify(self, peer: str, notice: JsonDict) -> None:
        target = self._fabric.lookup(peer)
        target._notices.put(
            Notice(src=self.name, buffer_name="", offset_bytes=0, nbytes=0, payload=dict(notice))
        )

    def poll_notices(self) -> list[Notice]:
        out: list[Notice] = []
        while True:
            try:
                out.append(self._notices.get_nowait())
            except queue.Empty:
                return out

    def recv_notice(self, timeout_s: float) -> Notice | None:
        try:
            return self._notices.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._buffers.clear()
