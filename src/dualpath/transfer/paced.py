"""`PacedBackend`: a transfer backend whose writes go through an emulated NIC (EMULATION).

The bytes' link time is spent first, chunk by chunk through `nic.tx` under the transfer's traffic class (so a
HIGH transfer overtakes a LOW one at the next chunk boundary), then the bytes are written in one piece with
the notice. Only the sender's tx is paced: a one-sided write cannot pace the receiver's rx from here. A
sender that queues writes on one thread passes each write's `ready_s`, so the link does not idle while that
thread waits for the GIL between writes.
"""

from __future__ import annotations

from dualpath.transfer.backend import Buffer, TransferBackend, byte_view
from dualpath.transfer.nic import EmulatedNic
from dualpath.transfer.types import JsonDict, Notice, TrafficClass


class PacedBackend:
    def __init__(self, backend: TransferBackend, nic: EmulatedNic) -> None:
        self.backend = backend
        self.nic = nic
        self.name = backend.name

    @property
    def address(self) -> str:
        return self.backend.address

    def register_buffer(self, buffer_name: str, nbytes: int) -> memoryview:
        return self.backend.register_buffer(buffer_name, nbytes)

    def add_peer(self, peer: str, address: str) -> None:
        self.backend.add_peer(peer, address)

    def write(
        self,
        peer: str,
        buffer_name: str,
        offset_bytes: int,
        data: Buffer,
        notice: JsonDict | None = None,
        *,
        traffic_class: TrafficClass = TrafficClass.LOW,
        ready_s: float | None = None,
    ) -> None:
        """`ready_s`: when the bytes were ready to go (time.monotonic()); an idle link starts them from
        then, not from when this thread got to run (`RateLimiter`)."""
        view = byte_view(data)
        self.nic.tx.transmit(view.nbytes, traffic_class, ready_s=ready_s)
        self.backend.write(peer, buffer_name, offset_bytes, view, notice)

    def notify(self, peer: str, notice: JsonDict) -> None:
        self.backend.notify(peer, notice)

    def poll_notices(self) -> list[Notice]:
        return self.backend.poll_notices()

    def recv_notice(self, timeout_s: float) -> Notice | None:
        return self.backend.recv_notice(timeout_s)

    def close(self) -> None:
        self.backend.close()
