"""The official `openai` client, unchanged, against a real `dualpath serve` (local-1p2d, the tiny model)."""

from __future__ import annotations

import httpx
import openai
import pytest
from runtime_helpers import make_cluster

USAGE = {"include_usage": True}
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Plan the next step of the agent. " * 4},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with make_cluster(tmp_path_factory.mktemp("openai") / "store") as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_models_list_names_the_served_model_and_its_context(client, model):
    card = client.models.list().data[0]
    assert model == "tiny-llama" and card.object == "model"
    assert card.model_extra["max_model_len"] > 0


def test_completions_whole_and_streamed_agree_and_report_usage(client, model):
    prompt = "The agent reads the file and"
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage.prompt_tokens == len(prompt) + 1  # bytes + BOS
    chunks = list(
        client.completions.create(
            model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True, stream_options=USAGE
        )
    )
    assert all(c.created > 0 and c.model == model for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_whole_and_streamed_agree_and_a_second_round_hits_the_cache(client, model):
    whole = client.chat.completions.create(model=model, messages=CONVERSATION, max_tokens=12, temperature=0)
    reply = whole.choices[0].message
    assert reply.role == "assistant" and whole.object == "chat.completion"
    stream = client.chat.completions.create(
        model=model, messages=CONVERSATION, max_tokens=12, temperature=0, stream=True, stream_options=USAGE
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens

    second = [
        *CONVERSATION,
        {"role": "assistant", "content": reply.content},
        {"role": "user", "content": "Go on."},
    ]
    again = client.chat.completions.create(
        model=model, messages=second, max_completion_tokens=4, temperature=0
    )
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.usage.prompt_tokens > whole.usage.prompt_tokens


def test_seeded_sampling_is_reproducible(client, model):
    def sample(seed: int) -> str:
        answer = client.completions.create(
            model=model, prompt="Sample this: ", max_tokens=16, temperature=0.9, top_p=0.95, seed=seed
        )
        return answer.choices[0].text

    assert sample(7) == sample(7)


def test_stop_strings_end_the_text_and_the_request(client, model):
    prompt = "Plan the next step. "
    full = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    cut = next((i for i in range(3, len(full)) if full[i].isprintable() and full[i] != "\ufffd"), None)
    if cut is None:
        pytest.skip("the tiny model's greedy text has no printable character to stop on")
    stop = full[cut]
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    assert answer.choices[0].text == full[: full.index(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_an_unknown_model_is_a_404_and_bad_fields_are_400s_naming_them(client, server):
    with pytest.raises(openai.NotFoundError, match="tiny-llama"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tiny-llama", messages=CONVERSATION, n=2)
    assert error.value.body["param"] == "n"
    surrogate = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, headers={"content-type": "application/json"},
                           content=b'{"messages": [{"role": "user", "content": "a\\ud800"}]}')  # fmt: skip
    assert surrogate.status_code == 400 and "messages.0.content" in surrogate.text
