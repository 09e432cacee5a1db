"""The real runtime against the in-process ReferenceEngine: same greedy tokens on every mode and read path."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from runtime_helpers import agent_rounds, complete, make_cluster

from dualpath.kvcache import FileStore, block_keys
from dualpath.runtime.prom import parse_snic

BLOCK_TOKENS = 16  # local-1p2d


def _corrupt_total(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("dualpath_corrupt_blocks_recomputed_total"):
            return float(line.split()[-1])
    return 0.0


def _assert_matches_reference(rounds, reference) -> None:
    for prompt, tokens, _ in rounds:
        assert tokens == reference.generate(prompt, len(tokens))


def _leftovers(pid: int) -> list[str]:
    shm = Path("/dev/shm")
    return sorted(p.name for p in shm.glob(f"dp_{pid}*")) if shm.is_dir() else []


def test_dualpath_de_read_path_matches_reference_persists_exact_kv_and_recomputes_corrupt_blocks(
    tmp_path, reference
):
    rng = np.random.default_rng(0)
    store_dir = tmp_path / "store"
    with make_cluster(store_dir, mode="dualpath", extra=("--read-path", "de-read")) as server:
        rounds = agent_rounds(reference, rng, rounds=3, append=40, gen=6, url=server.url)
        _assert_matches_reference(rounds, reference)
        assert [info["read_side"] for _, _, info in rounds] == ["none", "de_read", "de_read"]
        assert rounds[-1][2]["effective_hit_tokens"] == rounds[-1][2]["hit_tokens"] > 0

        # KV read back from the store equals a full recompute (float tolerance)
        prompt = rounds[-1][0]
        store = FileStore(store_dir, capacity_bytes=2**40)
        keys = block_keys(prompt, BLOCK_TOKENS)
        stored = [k for k in keys if store.contains(k)]
        assert len(stored) >= 4
        expected = reference.recompute_kv(prompt[: len(stored) * BLOCK_TOKENS])
        layers = len(expected)
        for b, key in enumerate(stored):
            block = torch.frombuffer(bytearray(store.read_full_block(key)), dtype=torch.float32).view(
                layers, BLOCK_TOKENS, -1
            )
            for layer in range(layers):
                torch.testing.assert_close(
                    block[layer], expected[layer][b * BLOCK_TOKENS : (b + 1) * BLOCK_TOKENS]
                )

        # a block that fails its checksum becomes a miss: recomputed, counted, never served
        path = store.path_of(keys[0])
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        context = rounds[-1][0] + rounds[-1][1] + [7] * 5
        body = complete(server.url, context, 4)
        assert body["choices"][0]["token_ids"] == reference.generate(context, 4)
        assert body["dualpath"]["effective_hit_tokens"] == 0 < body["dualpath"]["hit_tokens"]
        assert _corrupt_total(server.url) >= 1

        # the real server rejects a prompt longer than the model allows with a clear 400
        too_long = httpx.post(f"{server.url}/v1/completions", json={"prompt": [1] * 9000, "max_tokens": 1})
        assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]
        snic = parse_snic(httpx.get(f"{server.url}/metrics").text)
        assert snic["p0"]["rx"] == 0 and snic["d0"]["rx"] + snic["d1"]["rx"] > 0  # only DE SNICs read
        pid = server.process.pid
    assert server.process.returncode == 0
    assert _leftovers(pid) == []


@pytest.mark.parametrize(
    ("mode", "read_path", "sides"),
    [
        ("basic", None, {"pe_read"}),
        pytest.param("layerwise", None, {"pe_read"}, marks=pytest.mark.slow),
        # dualpath-rr (both sides, alternating) also runs in test_tcp_nodes.py
        pytest.param("dualpath-rr", None, {"pe_read", "de_read"}, marks=pytest.mark.slow),
        # dualpath with its own read path: test_replay.py serves two agents on it (reference tokens too)
        pytest.param("dualpath", None, None, marks=pytest.mark.slow),
        pytest.param("dualpath", "pe-read", {"pe_read"}, marks=pytest.mark.slow),
        pytest.param("dualpath", "split", None, marks=pytest.mark.slow),
        ("oracle", None, None),
    ],
)
def test_every_mode_and_read_path_serves_the_reference_tokens(tmp_path, reference, mode, read_path, sides):
    extra = ("--read-path", read_path) if read_path else ()
    with make_cluster(tmp_path / "store", mode=mode, extra=extra) as server:
        rounds = []
        for agent in range(2):
            rounds += agent_rounds(
                reference, np.random.default_rng(agent + 1), rounds=3, append=30, gen=5, url=server.url
            )
    _assert_matches_reference(rounds, reference)
    seen = {info["read_side"] for _, _, info in rounds} - {"none"}
    if sides is not None:
        assert seen == sides
    assert any(info["effective_hit_tokens"] > 0 for _, _, info in rounds)
