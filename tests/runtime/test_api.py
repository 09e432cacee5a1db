"""The HTTP API over a stub backend: every endpoint's answers, refusals that name the field, streaming."""

import json
import time

import httpx
import pytest
from api_stub import BOS, ApiStub, serve_in_thread
from fastapi.testclient import TestClient

from dualpath.runtime.api import build_app

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def stub():
    return ApiStub()


@pytest.fixture
def client(stub):
    return TestClient(build_app(stub))


def _events(response) -> list[dict]:
    lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


def test_completion_returns_token_ids_text_usage_with_cached_tokens_and_path_info(client):
    body = client.post("/v1/completions", json={"prompt": [65, 66], "max_tokens": 3}).json()
    choice = body["choices"][0]
    assert choice["token_ids"] == [67, 68, 69] and choice["text"] == "CDE"
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1},
    }
    assert body["object"] == "text_completion" and body["created"] > 0 and body["model"] == "stub"
    assert body["dualpath"]["read_side"] == "none"


def test_text_prompts_are_tokenized_and_one_element_prompt_lists_are_served(client, stub):
    client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    client.post("/v1/completions", json={"prompt": ["hi"], "max_tokens": 1})
    client.post("/v1/completions", json={"prompt": [[5, 6]], "max_tokens": 1})
    assert [r.prompt_token_ids for r in stub.requests] == [(BOS, 104, 105), (BOS, 104, 105), (5, 6)]


def test_completions_default_to_16_tokens_and_chat_to_the_rest_of_the_context(client, stub):
    client.post("/v1/completions", json={"prompt": [1]})
    client.post("/v1/chat/completions", json={"messages": USER})
    client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 9, "max_completion_tokens": 4})
    prompt = len(stub.requests[1].prompt_token_ids)
    assert [r.max_tokens for r in stub.requests] == [16, 128 - prompt, 4]


def test_sampling_fields_reach_the_backend(client, stub):
    body = {"prompt": [1], "max_tokens": 2, "temperature": 0.8, "top_p": 0.9, "top_k": 5000, "min_p": 0.1,
            "seed": -1, "stop_token_ids": [7], "min_tokens": 1, "presence_penalty": 0.5,
            "frequency_penalty": -0.5, "ignore_eos": True}  # fmt: skip
    assert client.post("/v1/completions", json=body).status_code == 200
    sampling = stub.requests[0].sampling
    assert (sampling.temperature, sampling.top_p, sampling.min_p) == (0.8, 0.9, 0.1)
    assert sampling.top_k == 260  # clamped to the vocabulary
    assert sampling.seed == 2**63 - 1  # int64 seeds map onto [0, 2^63)
    assert sampling.stop_token_ids == (7,) and sampling.min_tokens == 1 and sampling.ignore_eos
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.5)
    client.post("/v1/completions", json={"prompt": [1], "temperature": 1e-9})
    assert stub.requests[1].sampling.greedy


def test_chat_renders_the_template_and_answers_a_message(client, stub):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok", "tool_calls": None, "refusal": None},
        {"role": "developer", "content": "x"},
    ]
    body = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2}).json()
    assert bytes(stub.requests[0].prompt_token_ids[1:]).decode() == (
        "<system>be brief\n<user>a\nb\n<assistant>ok\n<system>x\n<assistant>"
    )
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": body["choices"][0]["message"]["content"],
    }
    assert body["usage"]["completion_tokens"] == 2


def test_chat_stream_sends_role_deltas_finish_and_a_usage_chunk(client):
    body = {"messages": USER, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        events = _events(response)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" and "created" in e for e in events)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert len(text) == 3
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3


def test_completion_stream_sends_token_ids_and_usage_only_when_asked(client):
    body = {"prompt": [1], "max_tokens": 2, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        events = _events(response)
    assert [e["choices"][0]["token_ids"] for e in events] == [[2], [3], []]
    assert events[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in events[-1]
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        events = _events(response)
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 2, 2]


def test_a_stop_string_is_trimmed_ends_the_request_and_cancels_it(client, stub):
    # the stub counts up from "a": "bcdefgh..."; the stop string "de" spans two tokens
    body = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 10, "stop": ["zz", "de"]}).json()
    assert body["choices"][0]["text"] == "bc" and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 4 and stub.cancelled == [stub.requests[0].request_id]
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 1  # the cancelled request's last info
    stream = {"prompt": "a", "max_tokens": 10, "stop": "d", "stream": True}
    with client.stream("POST", "/v1/completions", json=stream) as response:
        events = _events(response)
    assert "".join(e["choices"][0]["text"] for e in events) == "bc"


def test_stop_strings_wait_for_min_tokens(client):
    # "bcdefgh...": "c" comes before min_tokens (3) and does not count; "f" (the 5th token) does
    body = {"prompt": "a", "max_tokens": 10, "stop": ["c", "f"], "min_tokens": 3}
    answer = client.post("/v1/completions", json=body).json()["choices"][0]
    assert answer["text"] == "bcde" and answer["finish_reason"] == "stop"


def test_a_stop_token_or_eos_finishes_with_stop(client):
    body = client.post(
        "/v1/completions", json={"prompt": "a", "max_tokens": 10, "stop_token_ids": [100]}
    ).json()
    assert body["choices"][0]["text"] == "bcd" and body["choices"][0]["finish_reason"] == "stop"
    eos = TestClient(build_app(ApiStub(eos_after=2)))
    body = eos.post("/v1/completions", json={"prompt": "a", "max_tokens": 10}).json()
    assert body["choices"][0]["text"] == "bc" and body["choices"][0]["finish_reason"] == "stop"


def test_multibyte_characters_split_across_tokens_stream_whole(client):
    class Utf8Stub(ApiStub):  # generates the bytes of "é€" one token at a time
        async def generate(self, request):
            from dualpath.runtime.api import TokenChunk

            for byte in "é€".encode():
                yield TokenChunk(token_ids=(byte,))
            yield TokenChunk(token_ids=(), finish_reason="length")

    utf8 = TestClient(build_app(Utf8Stub()))
    with utf8.stream("POST", "/v1/chat/completions", json={"messages": USER, "stream": True}) as response:
        deltas = [e["choices"][0]["delta"].get("content") for e in _events(response)[1:-1]]
    assert deltas == ["é", "€"]


def test_models_tokenize_detokenize_and_version(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "stub"
    assert models["data"][0]["max_model_len"] == 128
    assert client.post("/tokenize", json={"prompt": "hé"}).json() == {
        "count": 4, "max_model_len": 128, "tokens": [BOS, 104, 195, 169]
    }  # fmt: skip
    assert client.post("/tokenize", json={"prompt": "h", "add_special_tokens": False}).json()["tokens"] == [
        104
    ]
    chat = client.post("/tokenize", json={"messages": USER}).json()["tokens"]
    assert bytes(chat[1:]).decode() == "<user>hi\n<assistant>"
    assert client.post("/detokenize", json={"tokens": [104, 195, 169]}).json() == {"prompt": "hé"}
    assert client.get("/version").json()["version"]


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1], "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": [1], "max_tokens": "x"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": [1], "bogus": 1}, 400, "bogus"),
        ("/v1/completions", {"prompt": []}, 400, "prompt"),
        ("/v1/completions", {"prompt": [300]}, 400, "prompt"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("/v1/completions", {"prompt": "a\ud800b"}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1] * 120, "max_tokens": 10}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": [1] * 128}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1], "n": 2}, 400, "n"),
        ("/v1/completions", {"prompt": [1], "logprobs": 1}, 400, "logprobs"),
        ("/v1/completions", {"prompt": [1], "logit_bias": {"1": 2}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": [1], "echo": True}, 400, "echo"),
        ("/v1/completions", {"prompt": [1], "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"prompt": [1], "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": [1], "stop_token_ids": [999]}, 400, "stop_token_ids"),
        ("/v1/completions", {"prompt": [1], "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
        ("/v1/completions", {"prompt": [1], "seed": 2**64}, 400, "seed"),
        ("/v1/completions", {"prompt": [1], "stream_options": {"bogus": 1}}, 400, "stream_options.bogus"),
        ("/v1/completions", {"prompt": [1], "model": "gpt-4"}, 404, "model"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0.role"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "\udfff"}]},
            400,
            "messages.0.content",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "x"}]}, 400, "messages"),
        ("/v1/chat/completions", {"messages": USER, "logprobs": True}, 400, "logprobs"),
        ("/v1/chat/completions", {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools"),
        (
            "/v1/chat/completions",
            {"messages": USER, "max_completion_tokens": 0},
            400,
            "max_completion_tokens",
        ),
        ("/v1/chat/completions", {"messages": USER, "model": "gpt-4"}, 404, "model"),
        ("/tokenize", {"prompt": "a", "messages": USER}, 400, "prompt"),
        ("/tokenize", {"prompt": "\ud800"}, 400, "prompt"),
        ("/detokenize", {"tokens": [1, 999]}, 400, "tokens"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ],
)
def test_bad_requests_get_a_4xx_that_names_the_field(client, path, body, status, field):
    response = client.post(
        path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"] and error["code"] == status


def test_admission_refusals_are_400s_with_the_backends_reason(client, stub):
    stub.refuse = "prompt needs 10 blocks but an engine holds 4"
    response = client.post("/v1/completions", json={"prompt": [1]})
    assert response.status_code == 400 and "an engine holds 4" in response.json()["error"]["message"]


def test_chat_without_max_tokens_gets_what_the_cluster_admits(client, stub):
    stub.kv_capacity_tokens = 50
    client.post("/v1/chat/completions", json={"messages": USER})
    request = stub.requests[0]
    assert len(request.prompt_token_ids) + request.max_tokens == 50
    stub.kv_capacity_tokens = 10  # less than the prompt: refused with the cluster's reason
    response = client.post("/v1/chat/completions", json={"messages": USER})
    assert response.status_code == 400 and "KV capacity of 10" in response.json()["error"]["message"]


def test_a_body_that_is_not_json_is_a_4xx_not_a_500(client):
    for content in (b"{not json", b"\xff\xfe", b"[1, 2]", b"null", b'"x"'):
        response = client.post(
            "/v1/completions", content=content, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, (content, response.text)


def test_errors_keep_the_keep_alive_connection_usable():
    """Issue 20 rows 1-2: a lone surrogate (400), a backend bug (500), then good requests, all on one
    connection: the server saw a single client port, so no error dropped the connection."""

    class BrokenStub(ApiStub):  # a backend bug: the last-resort guard answers 500 and keeps the connection
        def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
            if text == "boom":
                raise RuntimeError("backend bug")
            return super().tokenize(text, add_special_tokens=add_special_tokens)

    with serve_in_thread(build_app(BrokenStub())) as (url, client_ports):
        with httpx.Client(base_url=url, timeout=10) as http:
            for _ in range(3):
                assert http.post("/v1/completions", content=b'{"prompt": "a\\ud800b"}').status_code == 400
                assert http.post("/v1/completions", content=b"{oops").status_code == 400
                assert http.post("/v1/completions", json={"prompt": "boom"}).status_code == 500
                good = http.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2})
                assert good.status_code == 200
            assert http.post("/v1/chat/completions", json={"messages": USER}).status_code == 200
        assert len(client_ports) == 1


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_mid_request_cancels_it(stream):
    """Issue 20 row 3: the backend hears `cancel` for a request whose client disconnected."""
    stub = ApiStub(max_context_tokens=4096, step_s=0.02)
    body = {"prompt": [1], "max_tokens": 2000, "stream": stream}
    with serve_in_thread(build_app(stub)) as (url, _):
        with httpx.Client(base_url=url, timeout=10) as http:
            if stream:
                with http.stream("POST", "/v1/completions", json=body) as response:
                    lines = response.iter_lines()
                    assert next(lines).startswith("data: ")
            else:
                with pytest.raises(httpx.ReadTimeout):
                    http.post("/v1/completions", json=body, timeout=0.3)
        deadline = time.monotonic() + 5
        while not stub.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stub.cancelled == [stub.requests[0].request_id]


def test_health_and_metrics(client):
    assert client.get("/health").json() == {"status": "ok", "vocab_size": 260, "mode": "stub"}
    assert client.get("/metrics").text.startswith("# stub")
