"""DualPathConnector inside a real vLLM engine (CPU build): greedy outputs over multi-round trajectories with
store hits equal vLLM without any connector, on both read paths and in both load modes; layerwise loads
overlap compute; a corrupt block is recomputed, never served.

One reference engine (no connector, prefix caching off) runs every trajectory first; then one engine with the
connector per load mode runs them again. A trajectory's round r+1 prompt is round r's prompt + its output + an append, as in
an agentic session, so rounds ≥ 2 hit the blocks round r persisted.
"""

from __future__ import annotations

import gc
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .engine_gate import require_vllm_engine

require_vllm_engine()

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer import get_kv_transfer_group  # noqa: E402
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from dualpath.integrations.vllm.de_service import DeReadService, make_snic  # noqa: E402
from dualpath.integrations.vllm.tiny_model import VOCAB, write_tiny_llama  # noqa: E402
from dualpath.kvcache import FileStore, block_keys  # noqa: E402
from dualpath.kvcache.file_store import data_offset_bytes  # noqa: E402

BLOCK_TOKENS = 32
OUTPUT_TOKENS = 20
NAMESPACE = f"vt{os.getpid()}"


@dataclass(frozen=True)
class Trajectory:
    name: str
    read_path: str
    prompt: tuple[int, ...]
    appends: tuple[tuple[int, ...], ...]  # one per round after the first


def trajectory(name: str, read_path: str, seed: int, rounds: int = 3) -> Trajectory:
    rng = random.Random(seed)
    tokens = lambda n: tuple(rng.randrange(1, VOCAB) for _ in range(n))  # noqa: E731
    return Trajectory(name, read_path, tokens(150), tuple(tokens(40) for _ in range(rounds - 1)))


TRAJECTORIES = {
    t.name: t for t in (trajectory("pe", "pe", 1), trajectory("de", "de", 2), trajectory("bad", "pe", 3))
}


def engine_args(model: Path, **extra: Any) -> dict[str, Any]:
    return dict(
        model=str(model),
        skip_tokenizer_init=True,
        enforce_eager=True,
        enable_prefix_caching=False,  # every hit comes from our store, none from vLLM's own cache
        dtype="float32",
        block_size=BLOCK_TOKENS,
        max_model_len=1024,
        max_num_seqs=4,
        seed=0,
        **extra,
    )


def run_round(llm: LLM, prompt: list[int], read_path: str | None) -> list[int]:
    extra = {"kv_transfer_params": {"dualpath": {"read_path": read_path}}} if read_path else None
    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, detokenize=False, extra_args=extra)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


def prompts_and_outputs(
    llm: LLM, t: Trajectory, read_path: str | None, before_round: Any = None
) -> list[tuple[list[int], list[int]]]:
    prompt, rounds = list(t.prompt), []
    for r in range(len(t.appends) + 1):
        if before_round is not None:
            before_round(r, prompt)
        output = run_round(llm, prompt, read_path)
        rounds.append((prompt, output))
        if r < len(t.appends):
            prompt = prompt + output + list(t.appends[r])
    return rounds


def shut_down(llm: LLM) -> None:
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    llm = LLM(**engine_args(model_dir))
    try:
        return {name: prompts_and_outputs(llm, t, None) for name, t in TRAJECTORIES.items()}
    finally:
        shut_down(llm)


@dataclass
class Engine:
    llm: LLM
    load_mode: str
    store_dir: Path
    de: DeReadService

    @property
    def connector(self) -> Any:
        return get_kv_transfer_group()  # the worker-side connector of this process's engine


@pytest.fixture(scope="module", params=["staged", "layerwise"])
def engine(
    request: pytest.FixtureRequest,
    model_dir: Path,
    reference: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Engine]:
    load_mode = request.param
    store_dir = tmp_path_factory.mktemp(f"kvstore-{load_mode}")
    # The decode side of the DE read path: the same service a decode instance's connector runs
    # (de_serve_endpoint), here on its own, reading through its own SNIC.
    de = DeReadService(
        endpoint=f"de-{load_mode}",
        namespace=NAMESPACE,
        store=FileStore(store_dir, 2**30),
        snic=make_snic("de0.snic", 4e6),
    )
    kv = KVTransferConfig(
        kv_connector="DualPathConnector",
        kv_connector_module_path="dualpath.integrations.vllm",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={
            "store_dir": str(store_dir),
            "load_mode": load_mode,
            "snic_bytes_per_s": 4e6,  # emulated SNIC: a layer's reads take tens of ms, longer than its compute
            "endpoint": f"pe-{load_mode}",
            "namespace": NAMESPACE,
            "de_endpoint": f"de-{load_mode}",
            "persist_wait": True,
            "record_timeline": True,
        },
    )
    llm = LLM(**engine_args(model_dir, kv_transfer_config=kv))
    try:
        yield Engine(llm=llm, load_mode=load_mode, store_dir=store_dir, de=de)
    finally:
        shut_down(llm)
        de.close()


def test_pe_read_path_multi_round_equals_reference(engine: Engine, reference: dict[str, Any]) -> None:
    c = engine.connector
    read_before = c.snic.rx.stats().total_bytes
    got = prompts_and_outputs(engine.llm, TRAJECTORIES["pe"], "pe")
    assert got == reference["pe"]
    # rounds 2 and 3 loaded their history from the store through this instance's SNIC
    assert c.snic.rx.stats().total_bytes - read_before > 0


def test_de_read_path_multi_round_equals_reference(engine: Engine, reference: dict[str, Any]) -> None:
    c = engine.connector
    pe_before, de_before = c.snic.rx.stats().total_bytes, engine.de.snic.rx.stats().total_bytes
    got = prompts_and_outputs(engine.llm, TRAJECTORIES["de"], "de")
    assert got == reference["de"]
    assert engine.de.snic.rx.stats().total_bytes - de_before > 0  # the decode side read the hits...
    assert c.snic.rx.stats().total_bytes == pe_before  # ...and the prefill side's SNIC read none


@pytest.mark.parametrize("engine", ["layerwise"], indirect=True)
def test_layerwise_compute_starts_before_the_next_layer_has_arrived(engine: Engine) -> None:
    timelines = [t for t in engine.connector.timelines if len(t.compute_start_s) == len(t.landed_s)]
    assert timelines, "no step loaded a hit"
    for t in timelines:
        layers = len(t.landed_s)
        # never computes a layer before its KV is in the paged cache
        assert all(t.compute_start_s[i] >= t.landed_s[i] for i in range(layers))
    # and layer i runs while layer i+1 is still in flight (paper §4.1 layerwise prefill)
    overlapped = [
        t
        for t in timelines
        if any(t.compute_start_s[i] < t.landed_s[i + 1] for i in range(len(t.landed_s) - 1))
    ]
    assert len(overlapped) == len(timelines)


def test_a_corrupt_block_is_recomputed_and_the_output_still_equals_the_reference(
    engine: Engine, reference: dict[str, Any]
) -> None:
    store = engine.connector.store
    corrupt_before = store.stats().corrupt_blocks
    t = TRAJECTORIES["bad"]
    flipped: list[bytes] = []

    def corrupt_block_1(round_index: int, prompt: list[int]) -> None:
        if round_index != 1:
            return
        key = block_keys(prompt, BLOCK_TOKENS)[1]
        path = store.path_of(key)
        raw = bytearray(path.read_bytes())
        raw[data_offset_bytes(4) + 2 * (len(raw) - data_offset_bytes(4)) // 4 + 7] ^= 0x5A  # Layer Block 2
        path.write_bytes(bytes(raw))
        flipped.append(key)

    got = prompts_and_outputs(engine.llm, t, "pe", before_round=corrupt_block_1)
    assert flipped, "round 2 ran without corrupting a block"
    assert got == reference["bad"]
    assert store.stats().corrupt_blocks == corrupt_before + 1  # detected by its checksum
    # recomputed and persisted again: the block reads back whole
    assert len(store.read_full_block(flipped[0])) > 0
