"""`dualpath serve --model DIR`: a Hugging Face folder written by the test (bf16, sharded, trained BPE
tokenizer, chat template) served by a real local cluster; outputs equal the in-process reference over the
same weights, greedy and seeded-sampled, with EOS/stop ends and cancels; `plan --model DIR`; clear errors."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from hf_folder_factory import write_model_folder
from runtime_helpers import FAST_LINKS

from dualpath.runtime.launcher import ServeProcess
from dualpath.runtime.model import ReferenceEngine, load_hf_folder, load_tokenizer
from dualpath.runtime.sampling import SamplingParams

SAMPLED = {"temperature": 0.9, "top_p": 0.95, "top_k": 50, "seed": 1234}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_folder(tmp_path_factory.mktemp("models") / "tiny-chat", dtype="bfloat16", sharded=True)


@pytest.fixture(scope="module")
def reference(folder: Path) -> ReferenceEngine:
    return ReferenceEngine(load_hf_folder(folder))


@contextmanager
def serve_folder(folder: Path, store: Path, *, mode: str = "dualpath") -> Iterator[ServeProcess]:
    args = ("--model", str(folder), *(a for s in FAST_LINKS for a in ("--set", s)))
    with ServeProcess(
        "local-1p2d", mode=mode, store_dir=store, extra_args=args, start_timeout_s=180
    ) as server:
        yield server


def _complete(url: str, prompt: list[int], max_tokens: int, **fields: object) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, **fields}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _sampled_reference(reference: ReferenceEngine, prompt: list[int], max_tokens: int, eos: int) -> list[int]:
    params = SamplingParams(**SAMPLED, eos_token_ids=(eos,), ignore_eos=True)  # type: ignore[arg-type]
    return reference.generate(prompt, max_tokens, sampling=params)


def test_a_bf16_folder_serves_the_reference_tokens_chat_sampling_and_stops(
    folder, reference, tmp_path
) -> None:
    tokenizer = load_tokenizer(folder)
    with serve_folder(folder, tmp_path / "store") as server:
        health = server.health
        assert health["model"] == "tiny-chat" and health["max_context_tokens"] == 2048
        assert health["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # layers x K,V x kv heads x head_dim x bf16

        # greedy, two rounds of one conversation: the second reads the first's KV back from the store
        prompt = tokenizer.encode("An agent reads the file, runs the tests, and fixes the bug. " * 3)
        first = _complete(server.url, prompt, 12, ignore_eos=True)
        assert first["choices"][0]["token_ids"] == reference.generate(prompt, 12)
        context = prompt + first["choices"][0]["token_ids"] + tokenizer.encode("Then?", add_bos=False)
        second = _complete(server.url, context, 8, ignore_eos=True)
        assert second["choices"][0]["token_ids"] == reference.generate(context, 8)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32

        # chat: the folder's template and tokenizer; a second round of the conversation hits the cache
        messages = [
            {"role": "system", "content": "You are a careful coding agent. Answer briefly."},
            {"role": "user", "content": "Read the file, run the tests, and fix the failing test."},
        ]
        reply = _chat(server.url, messages, 10)
        expected = reference.generate(tokenizer.encode_chat(messages), 10)
        assert reply["choices"][0]["message"]["content"] == tokenizer.decode(expected)
        messages += [reply["choices"][0]["message"], {"role": "user", "content": "And now?"}]
        again = _chat(server.url, messages, 4)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

        # seeded sampling: the cluster draws what the reference draws with the same seed
        sampled = _complete(server.url, prompt, 16, ignore_eos=True, **SAMPLED)
        assert sampled["choices"][0]["token_ids"] == _sampled_reference(
            reference, prompt, 16, tokenizer.eos_id
        )
        assert sampled["choices"][0]["token_ids"] != first["choices"][0]["token_ids"][:16]

        # a stop token ends the output there ("stop"); min_tokens holds it back until reached
        greedy = reference.generate(prompt, 12)
        eos = (tokenizer.eos_id,)
        stop = greedy[4]
        stopped = _complete(server.url, prompt, 12, stop_token_ids=[stop])
        expected = reference.generate(
            prompt, 12, sampling=SamplingParams(stop_token_ids=(stop,), eos_token_ids=eos)
        )
        assert expected == greedy[: greedy.index(stop) + 1]
        assert (
            stopped["choices"][0]["token_ids"] == expected
            and stopped["choices"][0]["finish_reason"] == "stop"
        )
        held = _complete(server.url, prompt, 12, stop_token_ids=[stop], min_tokens=len(expected) + 1)
        params = SamplingParams(stop_token_ids=(stop,), min_tokens=len(expected) + 1, eos_token_ids=eos)
        assert held["choices"][0]["token_ids"] == reference.generate(prompt, 12, sampling=params)
        assert len(held["choices"][0]["token_ids"]) > len(expected)
        first_stop = _complete(server.url, prompt, 12, stop_token_ids=[greedy[0]])
        assert first_stop["choices"][0]["token_ids"] == greedy[:1]
        assert first_stop["choices"][0]["finish_reason"] == "stop"
        assert _active(server.url) == 0


def _chat(url: str, messages: list[dict], max_tokens: int) -> dict:
    body = {"model": "tiny-chat", "messages": messages, "max_tokens": max_tokens, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _active(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=10).json()["active_requests"])


def test_cancel_of_a_decoding_request_frees_the_cluster(tmp_path) -> None:
    """A client that leaves mid-stream: the request's DE stops it at a step boundary (tiny-llama would
    otherwise decode 8,000 tokens, minutes on this host), and the core forgets it."""
    with ServeProcess("local-1p2d", store_dir=tmp_path / "store", start_timeout_s=180) as server:
        body = {"prompt": [5] * 20, "max_tokens": 8000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            seen = [line for line, _ in zip(lines, range(4), strict=False) if line.startswith("data:")]
            assert seen
            assert _active(server.url) == 1
        deadline = time.monotonic() + 20
        while _active(server.url) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _active(server.url) == 0
        # the cluster still serves
        assert len(_complete(server.url, [7] * 20, 3, ignore_eos=True)["choices"][0]["token_ids"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
def test_seeded_sampling_gives_the_same_tokens_on_every_read_path(folder, reference, tmp_path, mode) -> None:
    tokenizer = load_tokenizer(folder)
    prompt = tokenizer.encode("KV cache blocks are read from storage by the prefill engine. " * 3)
    with serve_folder(folder, tmp_path / "store", mode=mode) as server:
        rounds = []
        context = prompt
        for _ in range(2):  # the second round hits: its KV comes over the mode's read path
            tokens = _complete(server.url, context, 10, ignore_eos=True, **SAMPLED)["choices"][0]["token_ids"]
            rounds.append(tokens)
            context = context + tokens + [7, 8, 9]
    context = prompt
    for tokens in rounds:
        assert tokens == _sampled_reference(reference, context, 10, tokenizer.eos_id)
        context = context + tokens + [7, 8, 9]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dualpath.cli.main", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_plan_reads_the_folder_and_serve_names_a_missing_folder_or_file(folder, tmp_path) -> None:
    plan = _cli("plan", "--model", str(folder), "--json")
    assert plan.returncode == 0, plan.stderr
    assert "tiny-chat" in plan.stdout
    missing = tmp_path / "no-such-model"
    result = _cli("serve", "--model", str(missing), "--port", "0")
    assert result.returncode != 0 and str(missing) in result.stderr
    broken = write_model_folder(tmp_path / "broken", dtype="float32")
    (broken / "tokenizer.json").unlink()
    result = _cli("serve", "--model", str(broken), "--port", "0")
    assert result.returncode != 0 and str(broken / "tokenizer.json") in result.stderr
