"""The schema fuzzer against a REAL `dualpath serve` (issue 20): hypothesis-generated bodies for every
endpoint (well-formed, mutated, non-object JSON, raw bytes; `test_api_fuzz`'s strategies) over ONE
keep-alive HTTP connection to a local-1p2d cluster running the tiny model: no 5xx, no dropped connection
(every answer came over the same client socket and none said `Connection: close`), healthy after.

A generating body that names no `max_tokens` / `max_completion_tokens` gets `max_tokens` 8 (chat's
default, the rest of the context, would make one body take seconds on the 2-core host); everything else
is sent as generated.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import FAST_LINKS
from test_api_fuzz import _ENDPOINT_BODIES, BATCH, _check

from dualpath.runtime.launcher import ServeProcess

REQUEST_TIMEOUT_S = 60.0  # a real cluster on a shared 2-core host: slower than the stub, still bounded
_GENERATING = ("/v1/completions", "/v1/chat/completions")


def _bounded(path: str, body: bytes) -> bytes:
    if path not in _GENERATING:
        return body
    try:
        value = json.loads(body)
    except ValueError:
        return body
    if isinstance(value, dict) and "max_tokens" not in value and "max_completion_tokens" not in value:
        value["max_tokens"] = 8
        return json.dumps(value).encode("utf-8", errors="surrogatepass")
    return body


def _fuzz_real_server(store: Path, requests: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    ports: set[int] = set()
    args = tuple(a for s in FAST_LINKS for a in ("--set", s))
    with ServeProcess("local-1p2d", store_dir=store, extra_args=args, start_timeout_s=180) as server:
        model = server.health["model"]
        with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as http:

            @settings(max_examples=requests // BATCH, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(batch=st.lists(_ENDPOINT_BODIES, min_size=BATCH, max_size=BATCH))
            def send(batch: list[tuple[str, bytes]]) -> None:
                for path, body in batch:
                    body = body.replace(b'"stub"', json.dumps(model).encode())  # the served model's id
                    response = http.post(path, content=_bounded(path, body),
                                         headers={"content-type": "application/json"})  # fmt: skip
                    _check(path, response)
                    assert response.headers.get("connection", "").lower() != "close", (path, body[:200])
                    stream = response.extensions["network_stream"]
                    ports.add(stream.get_extra_info("client_addr")[1])
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

            send()
            assert http.get("/health").json()["status"] == "ok"
            assert (
                http.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4}).status_code == 200
            )
        assert server.process is not None and server.process.poll() is None
    assert len(ports) == 1, ports  # one connection carried every request
    assert sum(statuses.values()) >= requests
    return statuses


def test_a_real_server_takes_a_thousand_generated_bodies_on_one_connection(tmp_path: Path) -> None:
    statuses = _fuzz_real_server(tmp_path / "store", 1000)
    assert statuses.get(200, 0) >= 100, statuses  # bodies reach generation too


@pytest.mark.slow
def test_a_real_server_takes_ten_thousand_generated_bodies_on_one_connection(tmp_path: Path) -> None:
    _fuzz_real_server(tmp_path / "store", 10_000)
