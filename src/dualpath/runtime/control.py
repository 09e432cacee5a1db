"""The control plane: JSON messages over ZeroMQ ROUTER (scheduler) / DEALER (one per node).

Only small JSON dicts travel here — reports, assignments, commands, completions, generated token ids. KV
bytes never do: they move through `dualpath.transfer` (shared memory on one host, ZeroMQ TCP across hosts).

Every message is a dict with a `"type"` key. A node's DEALER identity is its node id, so the scheduler
addresses a node by name. Sockets are created by their owners (the scheduler's asyncio loop, each node's
main loop), never shared between threads.
"""

from __future__ import annotations

import json
from typing import Any

import zmq

Message = dict[str, Any]


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(frame: bytes) -> Message:
    message = json.loads(frame)
    if not isinstance(message, dict) or "type" not in message:
        raise ValueError("control message without a type")
    return message


def dealer(context: zmq.Context, address: str, node_id: str) -> zmq.Socket:
    """A node's socket to the scheduler; `linger=0` so a node never hangs on exit (clean shutdown)."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, node_id.encode())
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    return socket


def send(socket: zmq.Socket, message: Message) -> None:
    socket.send(encode(message))


def recv_all(socket: zmq.Socket) -> list[Message]:
    """Every message waiting on a DEALER socket, without blocking. The socket's POLLIN event says when it is
    empty: a receive that fails with `zmq.Again` costs an exception per call, once per wake-up."""
    out: list[Message] = []
    while socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
        out.append(decode(socket.recv(zmq.NOBLOCK)))
    return out
