"""Issue 20 rows 3-5 against a real `dualpath serve`: a node killed with SIGKILL under load loses no
request (greedy tokens as an undisturbed run), no PE left is a prompt 503 with Retry-After, `dualpath
node` joins a killed node again, and abandoned long streams leave the decode nodes idle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from runtime_helpers import FAST_LINKS

from dualpath.runtime.launcher import ServeProcess, stop_process

pytestmark = pytest.mark.slow  # each starts a cluster (~10-20 s on the 2-core host)

PROMPTS = [[(7 * i + k) % 250 for k in range(60 + 30 * i)] for i in range(6)]


def _serve(store: Path, *extra: str) -> ServeProcess:
    args = tuple(a for s in FAST_LINKS for a in ("--set", s)) + extra
    return ServeProcess("local-1p2d", store_dir=store, extra_args=args, start_timeout_s=180)


def _complete(url: str, prompt: list[int], max_tokens: int) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def _all_at_once(url: str, max_tokens: int, during: Any = None) -> dict[int, httpx.Response]:
    out: dict[int, httpx.Response] = {}

    def one(i: int) -> None:
        out[i] = _complete(url, PROMPTS[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    if during is not None:
        during()
    for t in threads:
        t.join()
    return out


def _health(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/health", timeout=5).json())


def _wait_node(url: str, name: str, up: bool, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while _health(url)["nodes"][name]["up"] != up:
        assert time.monotonic() < deadline, f"{name} never became {'up' if up else 'down'}"
        time.sleep(0.2)


def _join(url: str, name: str) -> subprocess.Popen[bytes]:
    """`dualpath node` joining the running scheduler under `name` again."""
    health = _health(url)
    join, role = health["join"], health["nodes"][name]["role"]
    cmd = [sys.executable, "-m", "dualpath.cli.main", "node", "--role", role, "--name", name]
    cmd += ["--scheduler", join["scheduler"], "--store", join["store"], "--config", join["config"]]
    return subprocess.Popen(cmd + ["--namespace", join["namespace"]])


def _kill_later(url: str, name: str, after_s: float) -> Any:
    pid = _health(url)["nodes"][name]["pid"]

    def kill() -> None:
        time.sleep(after_s)
        os.kill(pid, signal.SIGKILL)

    return kill


@pytest.mark.parametrize("node", ["d0", "p0"])
def test_a_killed_node_loses_no_request_and_the_tokens_are_those_of_an_undisturbed_run(
    tmp_path: Path, node: str
) -> None:
    extra = ("--set", "num_prefill_nodes=2") if node == "p0" else ()
    with _serve(tmp_path / "ref", *extra) as server:
        reference = _all_at_once(server.url, 150)
    with _serve(tmp_path / "store", *extra) as server:
        got = _all_at_once(
            server.url, 150, during=_kill_later(server.url, node, 1.2 if node == "d0" else 0.1)
        )
        assert not _health(server.url)["nodes"][node]["up"]
        for i, response in got.items():
            assert response.status_code == 200, response.text
            assert (
                response.json()["choices"][0]["token_ids"] == reference[i].json()["choices"][0]["token_ids"]
            )
        if node == "d0":  # decoding at 1.2 s: some continued on d1 (a PE's work may all be done by then)
            assert sum(bool(r.json()["dualpath"].get("replans")) for r in got.values()) >= 1
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
            assert 'dualpath_node_down_total{node="d0"} 1.0' in metrics
            assert (
                'dualpath_node_up{node="d0"} 0.0' in metrics
                and "dualpath_requests_replanned_total" in metrics
            )
        assert _complete(server.url, PROMPTS[0], 4).status_code == 200  # still serving
        assert server.process is not None and server.process.poll() is None


def test_no_prefill_node_left_is_a_prompt_503_then_a_rejoined_node_serves(tmp_path: Path) -> None:
    with _serve(tmp_path / "store") as server:
        os.kill(_health(server.url)["nodes"]["p0"]["pid"], signal.SIGKILL)
        _wait_node(server.url, "p0", up=False, timeout_s=10)
        started = time.monotonic()
        refused = _complete(server.url, PROMPTS[0], 4)
        assert refused.status_code == 503 and time.monotonic() - started < 5
        assert refused.headers["retry-after"] and "no prefill node" in refused.json()["error"]["message"]
        node = _join(server.url, "p0")
        try:
            _wait_node(server.url, "p0", up=True)
            response = _complete(server.url, PROMPTS[1], 8)
            assert response.status_code == 200 and len(response.json()["choices"][0]["token_ids"]) == 8
        finally:
            stop_process(node)


def test_thirty_abandoned_long_streams_leave_the_decode_nodes_idle(tmp_path: Path) -> None:
    with _serve(tmp_path / "store") as server:

        def abandon(i: int) -> None:
            body = {
                "prompt": PROMPTS[i % 6][: 40 + i],
                "max_tokens": 8000,
                "ignore_eos": True,
                "stream": True,
            }
            leave_at = time.monotonic() + 3.0
            try:
                with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=3) as response:
                    for _ in response.iter_lines():
                        if time.monotonic() > leave_at:
                            break  # the client leaves: the connection closes with the stream
            except httpx.TimeoutException:
                pass  # no chunk within 3 s: it leaves too

        threads = [threading.Thread(target=abandon, args=(i,)) for i in range(30)]
        for t in threads:
            t.start()
        time.sleep(3.0)
        for t in threads:
            t.join(timeout=30)
        deadline = time.monotonic() + 15
        while _health(server.url)["active_requests"]:
            assert time.monotonic() < deadline, _health(server.url)["active_requests"]
            time.sleep(0.2)
        started = time.monotonic()
        assert _complete(server.url, PROMPTS[0], 8).status_code == 200
        assert time.monotonic() - started < 10
