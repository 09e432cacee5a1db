"""A `CompletionBackend` with no cluster, for the HTTP API's tests: it counts up from the last prompt token.

Byte tokenizer (ids 0-255 are UTF-8 bytes, 256 = BOS, 257 = EOS), a plain chat template, stop token ids,
EOS at `eos_after` generated tokens (unless ignore_eos), cancellation, and an optional admission check.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from dualpath.runtime.api import CompletionRequest, TokenChunk

BOS, EOS = 256, 257


class ApiStub:
    model_name = "stub"
    vocab_size = 260

    def __init__(self, *, max_context_tokens: int = 128, eos_after: int | None = None, step_s: float = 0.0):
        self.max_context_tokens = max_context_tokens
        self.eos_after = eos_after
        self.step_s = step_s
        self.requests: list[CompletionRequest] = []
        self.cancelled: list[str] = []
        self.refuse: str | None = None  # admission_error's answer
        self.kv_capacity_tokens: int | None = None  # admission_error refuses prompt + max_tokens beyond it

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS, *ids] if add_special_tokens else ids

    def detokenize(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")

    def chat_token_ids(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        if messages[0]["role"] == "assistant":
            raise ValueError("the chat template refused them: conversations start with system or user")
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return self.tokenize(text + ("<assistant>" if add_generation_prompt else ""))

    def admission_error(self, prompt_tokens: int, max_tokens: int) -> str | None:
        if self.kv_capacity_tokens is not None and prompt_tokens + max_tokens > self.kv_capacity_tokens:
            return f"prompt + max_tokens exceed the KV capacity of {self.kv_capacity_tokens} tokens"
        return self.refuse

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def is_ready(self) -> bool:
        return True

    def health_info(self) -> dict:
        return {"vocab_size": self.vocab_size, "mode": "stub"}

    def metrics_text(self) -> bytes:
        return b"# stub\n"

    async def generate(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        """Like SchedulerBackend.generate: closed before its last chunk (a client gone), it cancels."""
        self.requests.append(request)
        finished = False
        try:
            async for chunk in self._chunks(request):
                finished = chunk.finish_reason is not None
                yield chunk
        finally:
            if not finished and request.request_id not in self.cancelled:
                self.cancel(request.request_id)

    async def _chunks(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        token = request.prompt_token_ids[-1]
        info = {"read_side": "none", "cached_tokens": len(request.prompt_token_ids) // 2}
        stops = set(request.sampling.stop_token_ids)
        for i in range(request.max_tokens):
            if request.request_id in self.cancelled:
                break
            if self.step_s:
                await asyncio.sleep(self.step_s)
            at_eos = self.eos_after is not None and i == self.eos_after and not request.ignore_eos
            token = EOS if at_eos else (token + 1) % 256
            yield TokenChunk(token_ids=(token,))
            if at_eos or token in stops:
                yield TokenChunk(token_ids=(), finish_reason="stop", info=info)
                return
        reason = "abort" if request.request_id in self.cancelled else "length"
        yield TokenChunk(token_ids=(), finish_reason=reason, info=info)


@contextmanager
def serve_in_thread(app) -> Iterator[tuple[str, set[int]]]:
    """`app` under a real uvicorn on a free port in a thread: (url, the client ports it saw)."""
    import threading
    import time

    import uvicorn

    client_ports: set[int] = set()

    async def recording(scope, receive, send):
        if scope["type"] == "http":
            client_ports.add(scope["client"][1])
        await app(scope, receive, send)

    # port 0 and uvicorn's own socket: accepted connections get TCP_NODELAY (a socket passed in does not,
    # and each answer then waits ~40 ms for a delayed ACK)
    config = uvicorn.Config(recording, port=0, log_level="critical", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the test server did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", client_ports
    finally:
        server.should_exit = True
        thread.join(timeout=10)
