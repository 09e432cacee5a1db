"""`dualpath route` in front of a real vLLM server (OpenAI API, CPU build) with DualPathConnector and a decode
node's DE read service: two agents' multi-round greedy outputs through the router, with store hits on both read
paths, equal one vLLM engine without any connector (prefix caching off) on the same prompts."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

for _name, _value in {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
}.items():
    os.environ.setdefault(_name, _value)

vllm = pytest.importorskip(
    "vllm", reason="the vLLM extra is not installed (make vllm / pip install 'dualpath[vllm]')"
)

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from dualpath.integrations.vllm.de_service import DeReadService, make_snic  # noqa: E402
from dualpath.integrations.vllm.router import Router, RouterConfig, make_app  # noqa: E402
from dualpath.integrations.vllm.tiny_model import VOCAB, write_tiny_llama  # noqa: E402
from dualpath.kvcache import FileStore  # noqa: E402

BLOCK_TOKENS = 32
OUTPUT_TOKENS = 12
ROUNDS = 3
SERVER_START_S = 300.0
NAMESPACE = f"vr{os.getpid()}"


def agents() -> list[tuple[list[int], list[list[int]]]]:
    rng = random.Random(7)
    tokens = lambda n: [rng.randrange(1, VOCAB) for _ in range(n)]  # noqa: E731
    return [(tokens(140), [tokens(36) for _ in range(ROUNDS - 1)]) for _ in range(2)]


def engine_args(model: Path) -> dict[str, Any]:
    return dict(
        skip_tokenizer_init=True,
        enforce_eager=True,
        enable_prefix_caching=False,
        dtype="float32",
        block_size=BLOCK_TOKENS,
        max_model_len=1024,
        max_num_seqs=4,
        seed=0,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama-route"))


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> list[list[list[int]]]:
    """outputs[round][agent] of one engine without a connector, both agents' prompts batched per round."""
    llm = LLM(model=str(model_dir), **engine_args(model_dir))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, detokenize=False)
        prompts = [list(p) for p, _ in agents()]
        outputs = []
        for r in range(ROUNDS):
            got = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            outs = [list(o.outputs[0].token_ids) for o in got]
            outputs.append(outs)
            if r + 1 < ROUNDS:
                prompts = [
                    p + o + agents()[i][1][r] for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
                ]
        return outputs
    finally:
        del llm
        cleanup_dist_env_and_memory()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(
    model_dir: Path, reference: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    store_dir = tmp_path_factory.mktemp("kvstore-route")
    de = DeReadService(
        endpoint="d0", namespace=NAMESPACE, store=FileStore(store_dir, 2**30), snic=make_snic("d0", 0)
    )
    kv = {
        "kv_connector": "DualPathConnector",
        "kv_connector_module_path": "dualpath.integrations.vllm",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "store_dir": str(store_dir),
            "endpoint": "p0",
            "namespace": NAMESPACE,
            "persist_wait": True,
        },
    }
    port = free_port()
    # fmt: off
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--skip-tokenizer-init", "--enforce-eager", "--no-enable-prefix-caching", "--dtype", "float32",
        "--block-size", str(BLOCK_TOKENS), "--max-model-len", "1024", "--max-num-seqs", "4", "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port), "--kv-transfer-config", json.dumps(kv),
    ]
    # fmt: on
    log = (tmp_path_factory.getbasetemp() / "vllm-server.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            assert proc.poll() is None, f"the vLLM server exited; see {log.name}"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the vLLM server did not start in {SERVER_START_S} s"
            time.sleep(1)
        yield {"url": url, "store_dir": store_dir, "de": de, "model": str(model_dir)}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        de.close()


@pytest.mark.slow  # starts a vLLM server process: ≈ 40-100 s on 2 cores; `make test-vllm` runs it
def test_two_agents_through_the_router_equal_the_reference_on_both_read_paths(
    server: dict[str, Any], reference: list[list[list[int]]]
) -> None:
    router = Router(
        RouterConfig(
            prefill_urls=(server["url"],),
            de_endpoints=("d0",),
            store_dir=str(server["store_dir"]),
            full_block_tokens=BLOCK_TOKENS,
            mode="dualpath",
        ),
        client=httpx.AsyncClient(timeout=120),
    )
    app = make_app(router)

    async def trajectories() -> list[list[list[int]]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=120) as client:

            async def ask(prompt: list[int]) -> list[int]:
                body = {
                    "model": server["model"],
                    "prompt": prompt,
                    "max_tokens": OUTPUT_TOKENS,
                    "temperature": 0.0,
                    "return_token_ids": True,
                }
                answer = await client.post("/v1/completions", json=body)
                assert answer.status_code == 200, answer.text
                return list(answer.json()["choices"][0]["token_ids"])

            prompts = [list(p) for p, _ in agents()]
            outputs = []
            for r in range(ROUNDS):
                outs = list(await asyncio.gather(*(ask(p) for p in prompts)))  # both in flight at once
                outputs.append(outs)
                if r + 1 < ROUNDS:
                    prompts = [
                        p + o + agents()[i][1][r] for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
                    ]
        await router.client.aclose()
        return outputs

    de_before = server["de"].snic.rx.stats().total_bytes
    assert asyncio.run(trajectories()) == reference
    hit_paths = [p.read_path for p in router.placements if p.hit_tokens]
    assert len(hit_paths) == 2 * (ROUNDS - 1)  # every later round found its history in the store
    assert "de" in hit_paths and "pe" in hit_paths  # the second of two concurrent requests read on the DE
    assert server["de"].snic.rx.stats().total_bytes > de_before
    stats = router.stats()
    assert stats["tok"] == [0] and stats["pe_read_q_tokens"] == [0] and stats["de_read_q_tokens"] == {"d0": 0}
