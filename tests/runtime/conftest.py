"""Fixtures for runtime tests: a stub completion backend, the in-process reference model, the runtime
benchmark script as a module."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dualpath.runtime.api import CompletionRequest, TokenChunk


@pytest.fixture(scope="session")
def reference():
    """The in-process ReferenceEngine over the same seeded tiny model the nodes build."""
    from dualpath.runtime.model.reference import ReferenceEngine
    from dualpath.runtime.model_host import build_model

    return ReferenceEngine(build_model("tiny-llama", device="cpu", seed=0))


@pytest.fixture(scope="session")
def runtime_paths():  # type: ignore[no-untyped-def]
    """`benchmarks/runtime_paths.py` loaded as a module (a script, not a package: by its path)."""
    script = Path(__file__).parents[2] / "benchmarks" / "runtime_paths.py"
    spec = importlib.util.spec_from_file_location("runtime_paths", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
