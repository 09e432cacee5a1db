"""Helpers for runtime tests: a real local cluster in a child process, one agent's rounds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

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
