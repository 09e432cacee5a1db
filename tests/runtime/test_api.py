import json

import pytest
from fastapi.testclient import TestClient

from dualpath.runtime.api import build_app


@pytest.fixture
def client(stub_backend):
    return TestClient(build_app(stub_backend))


def test_completion_returns_token_ids_text_usage_and_path_info(client):
    body = client.post("/v1/completions", json={"prompt": [65, 66], "max_tokens": 3}).json()
    choice = body["choices"][0]
    assert choice["token_ids"] == [67, 68, 69] and choice["text"] == "CDE"
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert body["dualpath"] == {"read_side": "none"}


def test_text_prompts_are_tokenized(client, stub_backend):
    client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert stub_backend.requests[0].prompt_token_ids == (104, 105)


def test_streaming_sends_server_sent_events_and_done(client):
    with client.stream("POST", "/v1/completions", json={"prompt": [1], "max_tokens": 2, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert [e["choices"][0]["token_ids"] for e in events] == [[2], [3], []]
    assert events[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"max_tokens": 3}, 422, "prompt"),
        ({"prompt": [1], "max_tokens": 0}, 422, "max_tokens"),
        ({"prompt": [1], "max_tokens": "x"}, 422, "max_tokens"),
        ({"prompt": [1], "bogus": 1}, 422, "bogus"),
        ({"prompt": []}, 400, "empty"),
        ({"prompt": [300]}, 400, "vocabulary"),
        ({"prompt": [1] * 60, "max_tokens": 10}, 400, "context of 64"),
        ({"prompt": [1], "temperature": 0.7}, 400, "greedy"),
    ],
)
def test_bad_requests_get_a_4xx_that_names_the_problem(client, body, status, needle):
    response = client.post("/v1/completions", json=body)
    assert response.status_code == status
    assert needle in response.json()["error"]["message"]


def test_a_body_that_is_not_json_is_a_4xx_not_a_500(client):
    response = client.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500


def test_health_and_metrics(client):
    assert client.get("/health").json() == {"status": "ok", "vocab_size": 260, "mode": "stub"}
    assert client.get("/metrics").text.startswith("# stub")
