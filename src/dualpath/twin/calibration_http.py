"""Timing the client <-> scheduler HTTP legs: the real API app (`runtime.api.build_app`) over uvicorn in its
own process, a no-op backend, and the load generator's own client code path (`httpx`, SSE lines, JSON).

POST -> first chunk of a backend that answers at once is both HTTP legs of a TTFT; a stream of
single-token chunks prices each further chunk. Wall time, and the CPU of server and client per request
and per chunk (what the twin charges the scheduler and the client, docs/twin.md).
Run as `python -m dualpath.twin.calibration_http --port P --block-tokens B` it is the server side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from dualpath.twin.calibration import Tick

# The tiny model's vocabulary and context (config preset tiny-llama): the no-op backend validates the
# prompt's ids against them as the scheduler's backend does.
_VOCAB = 256
_MAX_CONTEXT_TOKENS = 1 << 20
_STREAM_TOKENS = 32  # chunks per streamed request for the per-chunk cost: a round's order of tokens
_START_TIMEOUT_S = 30.0


class NullBackend:
    """A `CompletionBackend` that answers at once, one single-token chunk per requested token, after the
    scheduler's own work per request (`ClusterScheduler.submit`): the prompt's block keys and its store hit."""

    model_name = "null"
    max_context_tokens = _MAX_CONTEXT_TOKENS
    vocab_size = _VOCAB

    def __init__(self, store: Any, block_tokens: int) -> None:
        self.store, self.block_tokens = store, block_tokens  # the calibrated cluster's block size

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def detokenize(self, token_ids: list[int]) -> str:
        return ""

    def admission_error(self, prompt_tokens: int, max_tokens: int) -> str | None:
        return None  # the API asks the backend as it asks the scheduler's (`api._Api.max_tokens`)

    def is_ready(self) -> bool:
        return True

    def health_info(self) -> dict[str, Any]:
        return {}

    def metrics_text(self) -> bytes:
        return b""

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        from dualpath.kvcache import block_keys
        from dualpath.runtime.api import TokenChunk

        self.store.hit_blocks(block_keys(list(request.prompt_token_ids), self.block_tokens))
        for i in range(request.max_tokens):
            last = i == request.max_tokens - 1
            await asyncio.sleep(0)  # each chunk its own write, as the scheduler's queue hands them over
            yield TokenChunk(token_ids=(i % _VOCAB,), finish_reason="length" if last else None)


def _serve(port: int, block_tokens: int, store_dir: str) -> None:
    """The API as `serve` runs it: inside its request limits (`runtime.limits` reads the body first)."""
    import uvicorn

    from dualpath.kvcache import FileStore
    from dualpath.runtime.api import build_app
    from dualpath.runtime.limits import RequestLimits, ServeLimits

    backend = NullBackend(FileStore(store_dir, capacity_bytes=2**40), block_tokens)
    app = RequestLimits(build_app(backend), ServeLimits())
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    uvicorn.Server(config).run()


def _process_cpu_s(pid: int) -> float:
    """utime + stime of process `pid` in seconds (Linux /proc), 0.0 where unreadable."""
    from dualpath.twin.host_load import clock_ticks_per_s, process_cpu_ticks

    return (process_cpu_ticks(pid) or 0) / clock_ticks_per_s()


async def _one(client: Any, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
    """(POST -> first chunk s, first -> last chunk s, chunks) with the load generator's parsing."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0}
    start = time.perf_counter()
    times = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            json.loads(line[len("data: ") :])
            times.append(time.perf_counter())
    return times[0] - start, times[-1] - times[0], len(times)


async def _measure(
    url: str, server_pid: int, prompts: Sequence[int], repeats: int, tick: Tick
) -> dict[str, Any]:
    """Wall time per request; CPU (this process + the server's, /proc ticks of 10 ms) per batch of repeats."""
    import httpx

    out: dict[str, Any] = {"prompt_tokens": [], "first_chunk_s": [], "cpu_prompt_tokens": [],
                           "cpu_per_request_s": []}  # fmt: skip
    async with httpx.AsyncClient(base_url=url, timeout=_START_TIMEOUT_S) as client:
        await _one(client, [1] * 16, 1)  # warm-up: connection, first-call imports
        for tokens in prompts:
            tick(f"http {tokens}")
            prompt = [i % _VOCAB for i in range(tokens)]
            cpu0 = time.process_time() + _process_cpu_s(server_pid)
            for _ in range(repeats):
                first_s, _, _ = await _one(client, prompt, 1)
                out["prompt_tokens"].append(tokens)
                out["first_chunk_s"].append(first_s)
            out["cpu_prompt_tokens"].append(tokens)
            out["cpu_per_request_s"].append(
                (time.process_time() + _process_cpu_s(server_pid) - cpu0) / repeats
            )
        tick("sse chunks")
        per_chunk, chunks_total = [], 0
        cpu0 = time.process_time() + _process_cpu_s(server_pid)
        for _ in range(repeats):
            _, stream_s, chunks = await _one(client, [1] * 16, _STREAM_TOKENS)
            per_chunk.append(stream_s / max(1, chunks - 1))
            chunks_total += chunks
        cpu_s = time.process_time() + _process_cpu_s(server_pid) - cpu0
        out["chunk_s"] = per_chunk
        # The requests' own fixed CPU (16-token prompts) is not a chunk's: taken off before dividing.
        fixed_cpu_s = out["cpu_per_request_s"][0] if out["cpu_per_request_s"] else 0.0
        out["cpu_per_chunk_s"] = max(0.0, cpu_s - repeats * fixed_cpu_s) / max(1, chunks_total - repeats)
    return out


def measure_http(prompts: Sequence[int], repeats: int, tick: Tick, *, block_tokens: int) -> dict[str, Any]:
    """The HTTP legs against a real API server process with the no-op backend (median-ready samples)."""
    from dualpath.runtime.launcher import free_port, stop_process, wait_healthy

    port = free_port()
    # The store's folder is this process's to remove: the server ends by SIGTERM, which uvicorn re-raises
    # after its shutdown, so no cleanup of the server's own would run.
    with tempfile.TemporaryDirectory(prefix="dualpath-calibration-store-") as store_dir:
        args = ["--port", str(port), "--block-tokens", str(block_tokens), "--store-dir", store_dir]
        server = subprocess.Popen([sys.executable, "-m", "dualpath.twin.calibration_http", *args])
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, _START_TIMEOUT_S, server)  # raises if it died or did not come up
            return asyncio.run(_measure(url, server.pid, prompts, repeats, tick))
        finally:
            stop_process(server)


def http_terms(m: dict[str, Any]) -> dict[str, float]:
    """Medians: the fixed leg, its growth per prompt token (two-point slope of per-size medians), per chunk."""
    by_size: dict[int, list[float]] = {}
    for n, t in zip(m["prompt_tokens"], m["first_chunk_s"], strict=True):
        by_size.setdefault(int(n), []).append(float(t))
    sizes = sorted(by_size)
    med = {n: statistics.median(by_size[n]) for n in sizes}
    cpu = {int(n): float(c) for n, c in zip(m["cpu_prompt_tokens"], m["cpu_per_request_s"], strict=True)}
    lo, hi = sizes[0], sizes[-1]
    slope = max(0.0, (med[hi] - med[lo]) / (hi - lo)) if hi > lo else 0.0
    cpu_slope = max(0.0, (cpu[hi] - cpu[lo]) / (hi - lo)) if hi > lo else 0.0
    return {
        "http_leg_s": max(0.0, med[lo] - slope * lo),
        "http_leg_s_per_prompt_token": slope,
        "http_cpu_s": max(0.0, cpu[lo] - cpu_slope * lo),
        "http_cpu_s_per_prompt_token": cpu_slope,
        "sse_chunk_s": statistics.median(m["chunk_s"]),
        "sse_chunk_cpu_s": float(m["cpu_per_chunk_s"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="no-op DualPath API server for `dualpath calibrate`")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--block-tokens", type=int, required=True)  # the calibrated cluster's
    parser.add_argument("--store-dir", required=True)  # an empty folder the caller removes
    _serve(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
