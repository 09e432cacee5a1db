"""Property test over the request schemas: generated bodies to every POST endpoint get no 5xx and no hang.

Bodies mix well-formed fields (so requests reach generation, streaming, stop strings) with wrong types,
out-of-range numbers, lone surrogates, unknown keys, non-object JSON and raw bytes. The stub backend runs
in-process over httpx's ASGI transport, so the 2,000 bodies per endpoint take seconds.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from api_stub import ApiStub, serve_in_thread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.protocol.requests import ChatCompletionBody, CompletionBody, DetokenizeBody, TokenizeBody
from dualpath.runtime.api import build_app

BODIES_PER_ENDPOINT = 2000
BATCH = 20  # bodies per generated example, sent concurrently
REQUEST_TIMEOUT_S = 10.0  # a request slower than this is a hang

_text = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2),  # lone surrogates
    st.sampled_from(["a", "stop", "\n", "é€", "<s>"]),
)
_ints = st.one_of(st.integers(-3, 300), st.integers(-(2**70), 2**70))
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-3, 3))
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), _ints, _floats, _text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=8,
)
_ids = st.lists(st.integers(0, 255), min_size=1, max_size=8)
_plain = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "developer"]), "content": _plain},
    optional={"name": _plain},
)

# Values that are valid (or nearly: edges included) for the fields that matter; other fields stay out
# of the well-formed part and come in only as mutations with arbitrary JSON.
_VALID = {
    "prompt": st.one_of(_plain, _ids, st.lists(_plain, min_size=1, max_size=2), st.lists(_ids, max_size=2)),
    "messages": st.lists(_message, min_size=1, max_size=3),
    "tokens": _ids,
    "max_tokens": st.integers(1, 24),
    "max_completion_tokens": st.integers(1, 24),
    "min_tokens": st.integers(0, 3),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 300),
    "min_p": st.floats(0, 1),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "stop": st.one_of(_plain, st.lists(_plain, max_size=3)),
    "stop_token_ids": _ids,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    ),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "n": st.just(1),
    "model": st.sampled_from(["stub", "other"]),
    "ignore_eos": st.booleans(),
    "user": _plain,
    "add_special_tokens": st.booleans(),
    "add_generation_prompt": st.booleans(),
}


def _bodies(schema) -> st.SearchStrategy:
    names = sorted(schema.model_fields)
    required = {n: _VALID.get(n, _json) for n in names if schema.model_fields[n].is_required()}
    optional = {n: _VALID[n] for n in names if n in _VALID and n not in required}
    well_formed = st.fixed_dictionaries(required, optional=optional)
    if schema is TokenizeBody:  # exactly one of prompt and messages
        prompt = {n: v for n, v in optional.items() if n not in ("prompt", "messages")}
        chat = dict(prompt)
        well_formed = st.one_of(
            st.fixed_dictionaries({"prompt": _plain}, optional=prompt),
            st.fixed_dictionaries({"messages": _VALID["messages"]}, optional=chat),
        )
    keys = st.one_of(st.sampled_from(names), _text)
    mutations = st.dictionaries(keys, _json, min_size=1, max_size=2)
    mutated = st.builds(lambda body, change: {**body, **change}, well_formed, mutations)
    as_json = st.one_of(well_formed, mutated, mutated, _json).map(_dumps)
    return st.one_of(as_json, as_json, as_json, as_json, st.binary(max_size=40))


def _dumps(value) -> bytes:
    return json.dumps(value).encode("utf-8", errors="surrogatepass")  # JSON escapes keep surrogates ASCII


def _check(path: str, response: httpx.Response) -> None:
    assert response.status_code < 500, (path, response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert response.json()["error"]["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        lines = [line for line in response.text.splitlines() if line]
        assert lines[-1] == "data: [DONE]"
        for line in lines[:-1]:
            assert "error" not in json.loads(line[len("data: ") :])
    else:
        response.json()


@pytest.mark.parametrize(
    ("path", "schema"),
    [
        ("/v1/completions", CompletionBody),
        ("/v1/chat/completions", ChatCompletionBody),
        ("/tokenize", TokenizeBody),
        ("/detokenize", DetokenizeBody),
    ],
)
def test_generated_bodies_never_get_a_5xx_or_hang(path, schema):
    stub = ApiStub(eos_after=20)
    transport = httpx.ASGITransport(app=build_app(stub))
    statuses: dict[int, int] = {}

    async def post_all(client: httpx.AsyncClient, bodies: list[bytes]) -> list[httpx.Response]:
        headers = {"content-type": "application/json"}
        posts = (
            asyncio.wait_for(client.post(path, content=b, headers=headers), REQUEST_TIMEOUT_S) for b in bodies
        )
        return await asyncio.gather(*posts)

    with asyncio.Runner() as runner:
        client = httpx.AsyncClient(transport=transport, base_url="http://stub")

        @settings(
            max_examples=BODIES_PER_ENDPOINT // BATCH,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(bodies=st.lists(_bodies(schema), min_size=BATCH, max_size=BATCH))
        def send(bodies: list[bytes]) -> None:
            for response in runner.run(post_all(client, bodies)):
                _check(path, response)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        send()
        runner.run(client.aclose())
    assert sum(statuses.values()) >= BODIES_PER_ENDPOINT
    assert statuses.get(200, 0) >= BODIES_PER_ENDPOINT // 10, statuses  # the bodies reach generation too


_ENDPOINT_BODIES = st.one_of(
    *(
        st.tuples(st.just(path), _bodies(schema))
        for path, schema in [
            ("/v1/completions", CompletionBody),
            ("/v1/chat/completions", ChatCompletionBody),
            ("/tokenize", TokenizeBody),
            ("/detokenize", DetokenizeBody),
        ]
    )
)


def _keep_alive_fuzz(requests: int) -> None:
    """Generated bodies to every endpoint over ONE keep-alive connection to a real uvicorn: no 5xx, the
    server saw one client port (no answer closed the connection), and it is healthy after."""
    with serve_in_thread(build_app(ApiStub(eos_after=20))) as (url, client_ports):
        with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as http:
            sent = 0

            @settings(max_examples=requests // BATCH, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(batch=st.lists(_ENDPOINT_BODIES, min_size=BATCH, max_size=BATCH))
            def send(batch: list[tuple[str, bytes]]) -> None:
                nonlocal sent
                for path, body in batch:
                    response = http.post(path, content=body, headers={"content-type": "application/json"})
                    _check(path, response)
                    sent += 1

            send()
            assert http.get("/health").json()["status"] == "ok"
            assert http.get("/v1/models").status_code == 200
        assert sent >= requests and len(client_ports) == 1


def test_one_keep_alive_connection_survives_a_thousand_generated_bodies():
    _keep_alive_fuzz(1000)


@pytest.mark.slow
def test_one_keep_alive_connection_survives_ten_thousand_generated_bodies():
    _keep_alive_fuzz(10_000)
