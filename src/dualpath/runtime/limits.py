"""What `dualpath serve` bounds so that no request can wedge it: body size, waiting requests, and time.

    body         a request body over `max_body_bytes` is refused with 413 before the app parses it
    queue        a generating request while `max_waiting` requests wait for placement: 429 + Retry-After
    deadline     a request still unfinished `request_timeout_s` after it arrived ends with a clean error
                 (504; in a stream, an error event) and is cancelled in the cluster

`RequestLimits` is a plain ASGI middleware wrapped around the API app (outside FastAPI, so the limits
hold whatever the routes do); the deadline lives with the backend, which owns each request's stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_BODY_BYTES = 16 * 2**20  # chosen: an 8K-token prompt as JSON ids is < 100 KiB; room for chat
DEFAULT_MAX_WAITING = 1024  # chosen: far above what the local cluster drains in a second, yet bounded
RETRY_AFTER_S = 1  # a full queue on the local cluster drains within seconds
_GENERATING_PATHS = ("/v1/completions", "/v1/chat/completions")
_CLOSE = [(b"connection", b"close")]


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_waiting: int = DEFAULT_MAX_WAITING
    request_timeout_s: float | None = None  # None: no deadline

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.max_waiting < 1:
            raise ValueError("max_body_bytes and max_waiting must be at least 1")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError("request_timeout_s must be positive")


Headers = list[tuple[bytes, bytes]]


async def _refuse(send: Any, status: int, message: str, headers: Headers) -> None:
    """The protocol's error body (`dualpath.protocol.errors`), sent as a whole response."""
    from dualpath.protocol.errors import error_body

    body = json.dumps(error_body(status, message)).encode()
    length = str(len(body)).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", length), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


NO_NODE_RETRY_AFTER_S = 2  # while no PE or no DE is up: a node restart takes a few seconds


class RequestLimits:
    """ASGI middleware: 413 for a body over the limit, 429 (Retry-After) while the queue is full."""

    def __init__(
        self,
        app: Any,
        limits: ServeLimits,
        queue_full: Callable[[], bool] = lambda: False,
        unavailable: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.queue_full = queue_full
        self.unavailable = unavailable  # why no request can be served now (no PE or no DE up): 503

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            why = f"request body of {int(declared)} bytes exceeds the limit of {limit}"
            await _refuse(send, 413, why, _CLOSE)  # its body stays unread: the connection cannot go on
            return
        body = bytearray()
        while True:  # read the body here (bounded), then replay it to the app
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            body += message.get("body", b"")
            if len(body) > limit:
                await _refuse(send, 413, f"request body exceeds the limit of {limit} bytes", _CLOSE)
                return
            if not message.get("more_body", False):
                break
        if scope.get("path") in _GENERATING_PATHS and self.queue_full():
            waiting = self.limits.max_waiting
            retry = [(b"retry-after", str(RETRY_AFTER_S).encode())]
            await _refuse(send, 429, f"{waiting} requests are waiting; retry later", retry)
            return
        if scope.get("path") in _GENERATING_PATHS and (why := self.unavailable()) is not None:
            await _refuse(send, 503, why, [(b"retry-after", str(NO_NODE_RETRY_AFTER_S).encode())])
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return dict(await receive())  # then the disconnect, when it comes

        await self.app(scope, replay, send)
