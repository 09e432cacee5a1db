"""The `TransferBackend` protocol: registered buffers, one-sided writes, completion notices.

Semantics are those of an RDMA WRITE with immediate (paper §5): the writer places bytes at an offset in a
buffer the peer registered, then the peer receives a small notice. The receiver never sees a half-written
region through a notice; bytes written without a notice are not promised to be visible yet.
"""

from __future__ import annotations

from typing import Protocol

from dualpath.transfer.types import JsonDict, Notice

Buffer = bytes | bytearray | memoryview


class TransferBackend(Protocol):
    name: str

    @property
    def address(self) -> str: ...
    def register_buffer(self, buffer_name: str, nbytes: int) -> memoryview: ...
    def add_peer(self, peer: str, address: str) -> None: ...
    def write(
        self, peer: str, buffer_name: str, offset_bytes: int, data: Buffer, notice: JsonDict | None = None
    ) -> None: ...
    def notify(self, peer: str, notice: JsonDict) -> None: ...
    def poll_notices(self) -> list[Notice]: ...
    def recv_notice(self, timeout_s: float) -> Notice | None: ...
    def close(self) -> None: ...


def byte_view(data: Buffer) -> memoryview:
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("transfer data must be a C-contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def check_range(buffer_name: str, size: int, offset_bytes: int, nbytes: int) -> None:
    if offset_bytes < 0 or offset_bytes + nbytes > size:
        raise ValueError(
            f"write of {nbytes} bytes at {offset_bytes} overruns buffer {buffer_name!r} ({size} bytes)"
        )
