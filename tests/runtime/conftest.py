"""Factory helpers for runtime tests: a real local cluster in a child process, a reference model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from dualpath.runtime.api import CompletionRequest, TokenChunk
from dualpath.runtime.launcher import ServeProcess

# Fast links for correctness tests: the emulation still paces every byte, just quickly.
FAST_LINKS = ("snic_bytes_per_s=400MB/s", "cnic_bytes_per_s=3200MB/s")


@contextmanager
def make_cluster(
    store_dir: Path,
    *,
    mode: str = "dualpath",
    settings: tuple[str, ...] = FAST_LINKS,
    extra: tuple[str, ...] = (),
) -> Iterator[ServeProcess]:
    args = tuple(a for s in settings for a in ("--set", s)) + extra
    with ServeProcess(
        "local-1p2d", mode=mode, store_dir=store_dir, extra_args=args, start_timeout_s=180
    ) as server:
        yield server


def complete(url: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="session")
def reference():
    """The in-process ReferenceEngine over the same seeded tiny model the nodes build."""
    from dualpath.runtime.model.reference import ReferenceEngine
    from dualpath.runtime.model_host import build_model

    return ReferenceEngine(build_model("tiny-llama", device="cpu", seed=0))


def agent_rounds(
    reference, rng, *, rounds: int, append: int, gen: int, url: str
) -> list[tuple[list[int], list[int], dict]]:
    """Run one agent's rounds against `url`: (prompt, served tokens, dualpath info) per round."""
    context: list[int] = []
    out = []
    for _ in range(rounds):
        context = context + [int(t) for t in rng.integers(0, 256, size=append)]
        body = complete(url, context, gen)
        tokens = body["choices"][0]["token_ids"]
        out.append((list(context), tokens, body["dualpath"]))
        context = context + tokens
    return out


class StubBackend:
    """A CompletionBackend that needs no cluster: counts up from the last prompt token."""

    model_name = "stub"
    max_context_tokens = 64
    vocab_size = 260

    def __init__(self) -> None:
        self.requests: list[CompletionRequest] = []

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def detokenize(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")

    def is_ready(self) -> bool:
        return True

    def health_info(self) -> dict:
        return {"vocab_size": self.vocab_size, "mode": "stub"}

    def metrics_text(self) -> bytes:
        return b"# stub\n"

    async def generate(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        self.requests.append(request)
        token = request.prompt_token_ids[-1]
        for _ in range(request.max_tokens):
            token = (token + 1) % 256
            yield TokenChunk(token_ids=(token,))
        yield TokenChunk(token_ids=(), finish_reason="length", info={"read_side": "none"})


@pytest.fixture
def stub_backend() -> StubBackend:
    return StubBackend()
