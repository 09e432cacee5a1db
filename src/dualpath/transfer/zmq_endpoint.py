"""The part both socket backends share: one PULL socket to receive, one PUSH socket per peer to send.

ZeroMQ (pyzmq) carries notices and, for TCP, payload frames; it queues messages until a peer connects and
blocks a sender at its high-water mark, which is the backpressure we want (DESIGN §4 "faults").
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

import zmq

from dualpath.transfer.types import Notice

LINGER_MS = 2000  # let queued messages flush on close instead of dropping them


class ZmqEndpoint:
    def __init__(self, name: str, bind_address: str) -> None:
        self.name = name
        self._ctx = zmq.Context()  # our own context: no process-global instance
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.linger = 0
        if bind_address.startswith("tcp://") and bind_address.endswith(":0"):
            port = self._pull.bind_to_random_port(bind_address.rsplit(":", 1)[0])
            self._address = f"{bind_address.rsplit(':', 1)[0]}:{port}"
        else:
            self._pull.bind(bind_address)
            self._address = bind_address
        self._peers: dict[str, zmq.Socket[bytes]] = {}
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()

    @property
    def address(self) -> str:
        return self._address

    def add_peer(self, peer: str, address: str) -> None:
        with self._send_lock:
            if peer in self._peers:
                self._peers[peer].close()
            sock = self._ctx.socket(zmq.PUSH)
            sock.linger = LINGER_MS
            sock.connect(address)
            self._peers[peer] = sock

    def _send(self, peer: str, frames: list[bytes | memoryview], *, copy: bool) -> zmq.MessageTracker | None:
        with self._send_lock:
            sock = self._peers.get(peer)
            if sock is None:
                raise KeyError(f"unknown peer {peer!r}: call add_peer(name, address) first")
            if copy:
                sock.send_multipart(frames, copy=True)
                return None
            return sock.send_multipart(frames, copy=False, track=True)

    @staticmethod
    def _header(wire: dict[str, object]) -> bytes:
        return json.dumps(wire, separators=(",", ":")).encode()

    def _on_message(self, frames: list[zmq.Frame]) -> Notice | None:
        """Turn one received message into a notice (None: data landed without a notice)."""
        raise NotImplementedError

    def poll_notices(self) -> list[Notice]:
        out: list[Notice] = []
        with self._recv_lock:
            while self._pull.poll(0):
                notice = self._on_message(self._pull.recv_multipart(copy=False))
                if notice is not None:
                    out.append(notice)
        return out

    def recv_notice(self, timeout_s: float) -> Notice | None:
        deadline = time.monotonic() + timeout_s
        with self._recv_lock:
            while True:
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
                if not self._pull.poll(wait_ms):
                    return None
                notice = self._on_message(self._pull.recv_multipart(copy=False))
                if notice is not None:
                    return notice

    def close(self) -> None:
        with self._send_lock:
            for sock in self._peers.values():
                sock.close()
            self._peers.clear()
        self._pull.close()
        self._ctx.term()
        if self._address.startswith("ipc://"):
            # libzmq (4.3) leaves a bound ipc endpoint's socket file behind on close: it is ours to remove.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._address.removeprefix("ipc://"))
