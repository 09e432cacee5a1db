"""`SharedMemoryBackend`: one host, many processes; the write is a memcpy into the peer's segment.

    writer process                          receiver process (owns the segment)
    write(peer, buf, off, data, notice)
      memcpy ─────────────────────────────► dp_<ns>_<peer>_<buf> [off, off+n)   (POSIX shared memory)
      PUSH notice ──── ZeroMQ (ipc) ──────► PULL ─► poll_notices() -> Notice

The notice is sent after the memcpy returns, so a receiver that sees it sees the bytes (same host, coherent
caches). Peers attach a segment by its name, so the namespace must be shared by all nodes of one run.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import tempfile
from multiprocessing import shared_memory
from pathlib import Path

import zmq

from dualpath.transfer.backend import Buffer, byte_view, check_range
from dualpath.transfer.types import JsonDict, Notice
from dualpath.transfer.zmq_endpoint import ZmqEndpoint

_DEV_SHM = Path("/dev/shm")


def segment_name(namespace: str, node: str, buffer_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"dp_{namespace}_{node}_{buffer_name}")


def default_ipc_address(namespace: str, node: str) -> str:
    return f"ipc://{tempfile.gettempdir()}/{segment_name(namespace, node, 'notices')}.sock"


class SharedMemoryBackend(ZmqEndpoint):
    def __init__(self, name: str, *, namespace: str, address: str | None = None) -> None:
        super().__init__(name, address or default_ipc_address(namespace, name))
        self.namespace = namespace
        self._owned: dict[str, shared_memory.SharedMemory] = {}
        self._attached: dict[tuple[str, str], memoryview] = {}
        self._views: dict[str, memoryview] = {}

    def register_buffer(self, buffer_name: str, nbytes: int) -> memoryview:
        if buffer_name in self._owned:
            raise ValueError(f"buffer {buffer_name!r} already registered on {self.name!r}")
        seg_name = segment_name(self.namespace, self.name, buffer_name)
        try:
            shm = shared_memory.SharedMemory(seg_name, create=True, size=nbytes)
        except FileExistsError:  # left behind by a crashed run of the same namespace
            stale = shared_memory.SharedMemory(seg_name)
            stale.close()
            stale.unlink()
            shm = shared_memory.SharedMemory(seg_name, create=True, size=nbytes)
        self._owned[buffer_name] = shm
        if _DEV_SHM.is_dir():
            # Map it ourselves and close the library's map now: views handed to the caller then never
            # block close() ("cannot close exported pointers exist"); the map lives as long as the views.
            self._views[buffer_name] = _attach(seg_name)[:nbytes]
            shm.close()
        else:
            assert shm.buf is not None
            self._views[buffer_name] = shm.buf[:nbytes]
        return self._views[buffer_name]

    def add_peer(self, peer: str, address: str) -> None:
        """A peer (again): a restarted peer owns new segments under the same names, so maps of the old
        ones are dropped and the next write attaches afresh."""
        for key in [k for k in self._attached if k[0] == peer]:
            view = self._attached.pop(key)
            with contextlib.suppress(BufferError):  # a write in flight still holds it: let it go with that
                view.release()
        super().add_peer(peer, address)

    def write(
        self, peer: str, buffer_name: str, offset_bytes: int, data: Buffer, notice: JsonDict | None = None
    ) -> None:
        view = byte_view(data)
        target = self._segment(peer, buffer_name)
        check_range(buffer_name, target.nbytes, offset_bytes, view.nbytes)
        target[offset_bytes : offset_bytes + view.nbytes] = view
        if notice is not None:
            wire = Notice(
                src=self.name,
                buffer_name=buffer_name,
                offset_bytes=offset_bytes,
                nbytes=view.nbytes,
                payload=dict(notice),
            ).to_wire()
            self._send(peer, [self._header(wire)], copy=True)

    def notify(self, peer: str, notice: JsonDict) -> None:
        wire = Notice(src=self.name, buffer_name="", offset_bytes=0, nbytes=0, payload=dict(notice)).to_wire()
        self._send(peer, [self._header(wire)], copy=True)

    def _on_message(self, frames: list[zmq.Frame]) -> Notice | None:
        return Notice.from_wire(json.loads(frames[0].bytes))

    def _segment(self, peer: str, buffer_name: str) -> memoryview:
        if peer == self.name:
            return self._views[buffer_name]
        key = (peer, buffer_name)
        if key not in self._attached:
            self._attached[key] = _attach(segment_name(self.namespace, peer, buffer_name))
        return self._attached[key]

    def close(self) -> None:
        super().close()
        for view in self._attached.values():
            view.release()
        self._attached.clear()
        for shm in self._owned.values():
            with contextlib.suppress(BufferError):  # non-Linux: the caller may still hold a view
                shm.close()
            shm.unlink()  # the name goes now; the memory when the last map of it is gone
        self._owned.clear()
        self._views.clear()


def _attach(seg_name: str) -> memoryview:
    """Map a peer's segment without registering it with this process's resource tracker.

    Why not SharedMemory(name): in Python 3.11 attaching registers the segment with the resource tracker,
    which then unlinks the *owner's* segment when this process exits. Mapping /dev/shm directly avoids that.
    """
    if not _DEV_SHM.is_dir():  # not Linux: fall back to the library and accept its tracker
        shm = shared_memory.SharedMemory(seg_name)
        assert shm.buf is not None
        return shm.buf
    fd = os.open(_DEV_SHM / seg_name, os.O_RDWR)
    try:
        return memoryview(mmap.mmap(fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)
