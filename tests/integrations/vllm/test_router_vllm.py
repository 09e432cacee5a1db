"""`dualpath route` in front of a real vLLM server (OpenAI API, CPU build) with DualPathConnector and a decode
node's DE read service: two agents' multi-round greedy outputs through the router, with store hits on both read
paths, equal one vLLM engine without any connector (prefix caching off) on the same prompts."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .engine_gate import require_vllm_engine

require_vllm_engine()

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from dualpath.integrations.vllm.de_service import DeReadService, make_snic  # noqa: E402
from dualpath.integrations.vllm.router import Router, RouterConfig, make_app  # noqa: E402
from dualpath.integrations.vllm.servers import vllm_server  # noqa: E402
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


@pytest.fixture(scope="module")
def server(
    model_dir: Path, reference: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The prefill instance p0 and a decode node's DE read service d0 (in this process)."""
    store_dir = tmp_path_factory.mktemp("kvstore-route")
    de = DeReadService(
        endpoint="d0", namespace=NAMESPACE, store=FileStore(store_dir, 2**30), snic=make_snic("d0", 0)
    )
    extra = {"store_dir": str(store_dir), "endpoint": "p0", "namespace": NAMESPACE, "persist_wait": True}
    try:
        with vllm_server(model_dir, extra, tmp_path_factory.getbasetemp() / "vllm-p0.log") as url:
            yield {"url": url, "store_dir": store_dir, "de": de, "model": str(model_dir)}
    finally:
        de.close()


async def run_agents(router: Router, model: str) -> list[list[list[int]]]:
    """Both agents' rounds through the router, the two requests of a round in flight at once."""
    transport = httpx.ASGITransport(app=make_app(router))
    async with httpx.AsyncClient(transport=transport, base_url="http://router", timeout=120) as client:

        async def ask(prompt: list[int]) -> list[int]:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": OUTPUT_TOKENS,
                "temperature": 0.0,
                "return_token_ids": True,
            }
            answer = await client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            choice = answer.json()["choices"][0]
            assert answer.json()["usage"]["completion_tokens"] == len(choice["token_ids"])
            return list(choice["token_ids"])

        prompts = [list(p) for p, _ in agents()]
        outputs = []
        for r in range(ROUNDS):
            outs = list(await asyncio.gather(*(ask(p) for p in prompts)))
            outputs.append(outs)
            if r + 1 < ROUNDS:
                prompts = [
                    p + o + agents()[i][1][r] for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
                ]
    await router.client.aclose()
    return outputs


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
    de_before = server["de"].snic.rx.stats().total_bytes
    assert asyncio.run(run_agents(router, server["model"])) == reference
    hit_paths = [p.read_path for p in router.placements if p.hit_tokens]
    assert len(hit_paths) == 2 * (ROUNDS - 1)  # every later round found its history in the store
    assert "de" in hit_paths and "pe" in hit_paths  # the second of two concurrent requests read on the DE
    assert server["de"].snic.rx.stats().total_bytes > de_before
    stats = router.stats()
    assert stats["tok"] == [0] and stats["pe_read_q_tokens"] == [0] and stats["de_read_q_tokens"] == {"d0": 0}


@pytest.mark.slow  # a second vLLM server process
def test_the_pd_hand_off_through_the_router_equals_the_reference(
    server: dict[str, Any], reference: list[list[list[int]]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """p0 prefills (its hits on both read paths), e0 loads p0's KV for the prompt and decodes."""
    store_dir = tmp_path_factory.mktemp("kvstore-pd")  # a fresh store: round 1 of each agent is all miss
    de = DeReadService(
        endpoint="d1", namespace=NAMESPACE, store=FileStore(store_dir, 2**30), snic=make_snic("d1", 0)
    )
    p_extra = {"store_dir": str(store_dir), "endpoint": "p1", "namespace": NAMESPACE, "persist_wait": True}
    e_extra = {"store_dir": str(store_dir), "endpoint": "e1", "namespace": NAMESPACE, "persist_wait": True}
    base = tmp_path_factory.getbasetemp()
    try:
        with (
            vllm_server(Path(server["model"]), p_extra, base / "vllm-p1.log") as p_url,
            vllm_server(Path(server["model"]), e_extra, base / "vllm-e1.log") as e_url,
        ):
            router = Router(
                RouterConfig(
                    prefill_urls=(p_url,),
                    prefill_endpoints=("p1",),
                    decode_urls=(e_url,),
                    de_endpoints=("d1",),
                    store_dir=str(store_dir),
                    full_block_tokens=BLOCK_TOKENS,
                ),
                client=httpx.AsyncClient(timeout=120),
            )
            assert asyncio.run(run_agents(router, server["model"])) == reference
            hit_paths = [p.read_path for p in router.placements if p.hit_tokens]
            assert len(hit_paths) == 2 * (ROUNDS - 1) and "de" in hit_paths
            # every decode took the whole prompt's KV from the prefill instance (none recomputed)
            loaded = [h["dualpath"]["pd_loaded_tokens"] for h in router.handoffs]
            assert loaded == [p.prompt_tokens for p in router.placements]
            assert router.book.decode_tok == [0]
    finally:
        de.close()
