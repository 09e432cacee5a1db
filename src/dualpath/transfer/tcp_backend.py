"""`TcpBackend`: nodes on different hosts; payload bytes travel as a zero-copy ZeroMQ frame.

    writer: PUSH [header-json, payload] ──── tcp ────► receiver: PULL
                                                       copy payload into registered buffer [off, off+n)
                                                       then hand the notice to poll_notices()/recv_notice()

The receiver places the bytes inside poll_notices/recv_notice, so (as with RDMA WRITE with immediate) the
bytes are in the buffer by the time the notice is seen. Large payloads are sent with copy=False and
`write` returns once ZeroMQ has released the caller's buffer, so the caller may reuse it at once.
"""

from __future__ import annotations

import json

import zmq

from dualpath.transfer.backend import Buffer, byte_view, check_range
from dualpath.transfer.types import JsonDict, Notice
from dualpath.transfer.zmq_endpoint import ZmqEndpoint

# Below this, a copy is cheaper than ZeroMQ's zero-copy bookkeeping (pyzmq docs: "copy_threshold", 64 KiB).
ZERO_COPY_MIN_BYTES = 64 * 1024


class TcpBackend(ZmqEndpoint):
    def __init__(self, name: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(name, f"tcp://{host}:{port}")
        self._buffers: dict[str, memoryview] = {}

    def register_buffer(self, buffer_name: str, nbytes: int) -> memoryview:
        if buffer_name in self._buffers:
            raise ValueError(f"buffer {buffer_name!r} already registered on {self.name!r}")
        self._buffers[buffer_name] = memoryview(bytearray(nbytes))
        return self._buffers[buffer_name]

    def write(
        self, peer: str, buffer_name: str, offset_bytes: int, data: Buffer, notice: JsonDict | None = None
    ) -> None:
        view = byte_view(data)
        wire = Notice(
            src=self.name,
            buffer_name=buffer_name,
            offset_bytes=offset_bytes,
            nbytes=view.nbytes,
            payload=dict(notice or {}),
        ).to_wire()
        wire["notify"] = notice is not None
        tracker = self._send(peer, [self._header(wire), view], copy=view.nbytes < ZERO_COPY_MIN_BYTES)
        if tracker is not None:
            tracker.wait()

    def notify(self, peer: str, notice: JsonDict) -> None:
        wire = Notice(src=self.name, buffer_name="", offset_bytes=0, nbytes=0, payload=dict(notice)).to_wire()
        wire["notify"] = True
        self._send(peer, [self._header(wire)], copy=True)

    def _on_message(self, frames: list[zmq.Frame]) -> Notice | None:
        """Place the payload, then release the notice. A write that does not fit is dropped and its notice
        carries the error (the sender cannot check a remote buffer's size; RDMA reports a remote access
        error the same way, at completion)."""
        wire = json.loads(frames[0].bytes)
        notify = wire.pop("notify")
        if len(frames) > 1:
            payload = frames[1].buffer
            buf = self._buffers.get(wire["buffer_name"])
            try:
                if buf is None:
                    raise ValueError(f"no registered buffer {wire['buffer_name']!r} on {self.name!r}")
                check_range(wire["buffer_name"], buf.nbytes, wire["offset_bytes"], payload.nbytes)
                buf[wire["offset_bytes"] : wire["offset_bytes"] + payload.nbytes] = payload
            except ValueError as err:
                wire["error"], notify = str(err), True
        return Notice.from_wire(wire) if notify else None
