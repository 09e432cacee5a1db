"""The `openai` client against `dualpath serve --model DIR`: a bf16 Llama folder written by the test, with
its trained BPE tokenizer (multi-byte tokens) and its chat template. Streamed text equals the reference
forward's tokens decoded; stop strings cut inside the text; a second round of the conversation is a hit."""

from __future__ import annotations

import openai
import pytest
from hf_folder_factory import write_model_folder
from runtime_helpers import FAST_LINKS

from dualpath.runtime.launcher import ServeProcess
from dualpath.runtime.model import ReferenceEngine, load_hf_folder, load_tokenizer

# ~40 s: starts a cluster on a model folder. The default suite serves a folder's chat with cached tokens in
# test_serve_model_folder.py; this adds the official client, streaming and stop strings on a BPE tokenizer.
pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "You are a careful coding agent. Answer briefly."},
    {"role": "user", "content": "Read the file, run the tests, and fix the failing test. " * 3},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_model_folder(tmp_path_factory.mktemp("models") / "tiny-chat", dtype="bfloat16")


@pytest.fixture(scope="module")
def client(folder, tmp_path_factory):
    args = ("--model", str(folder), *(a for s in FAST_LINKS for a in ("--set", s)))
    store = tmp_path_factory.mktemp("store")
    with ServeProcess("local-1p2d", store_dir=store, extra_args=args, start_timeout_s=180) as server:
        url = f"{server.url}/v1"
        yield openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=120)


def test_chat_streams_the_reference_text_and_a_second_round_hits_the_cache(client, folder):
    tokenizer = load_tokenizer(folder)
    expected_ids = ReferenceEngine(load_hf_folder(folder)).generate(tokenizer.encode_chat(MESSAGES), 16)
    assert client.models.list().data[0].id == "tiny-chat"
    stream = client.chat.completions.create(
        model="tiny-chat",
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tokenizer.decode(expected_ids)
    assert chunks[-1].usage.completion_tokens == 16

    second = [*MESSAGES, {"role": "assistant", "content": text}, {"role": "user", "content": "And now?"}]
    again = client.chat.completions.create(model="tiny-chat", messages=second, max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_a_stop_string_cuts_the_text_where_it_starts(client, folder):
    tokenizer = load_tokenizer(folder)
    prompt = "The quick brown fox jumps over the lazy dog. " * 2
    full = client.completions.create(
        model="tiny-chat", prompt=prompt, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
    )
    text = full.choices[0].text
    assert text == tokenizer.decode(full.choices[0].model_extra["token_ids"])
    stop = text.strip()[2:4]
    if len(stop) < 2:
        pytest.skip("the random model's greedy text is too short to pick a stop string from")
    stopped = client.completions.create(
        model="tiny-chat",
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        stop=stop,
        extra_body={"ignore_eos": True},
    )
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
