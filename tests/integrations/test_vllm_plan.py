"""The connector's vLLM-free parts: settings, hit length, the blocks a request loads and persists."""

from __future__ import annotations

import pytest

from dualpath.integrations.vllm.config import ConnectorConfig, shard_dir, shard_name
from dualpath.integrations.vllm.plan import RequestTrack, blocks_to_persist, hit_blocks, spans
from dualpath.kvcache import block_keys
from dualpath.kvcache.keys import ROOT_KEY


def test_config_reads_extra_config_and_names_bad_keys() -> None:
    cfg = ConnectorConfig.from_extra({"store_dir": "/x", "snic_bytes_per_s": "5e6", "persist_wait": "true"})
    assert cfg.snic_bytes_per_s == 5e6 and cfg.persist_wait is True and cfg.read_path == "pe"
    with pytest.raises(ValueError, match="store_dirr"):
        ConnectorConfig.from_extra({"store_dirr": "/x"})
    with pytest.raises(ValueError, match="read_path"):
        ConnectorConfig.from_extra({"store_dir": "/x", "read_path": "both"})
    with pytest.raises(ValueError, match="store_dir"):
        ConnectorConfig.from_extra({})


def test_hit_never_covers_the_last_prompt_token() -> None:
    tokens = list(range(64))  # exactly two blocks of 32: the second holds the last token
    keys, hit = hit_blocks(tokens, 32, lambda key: True)
    assert len(keys) == 1 and hit == 1
    keys, hit = hit_blocks(list(range(65)), 32, lambda key: True)
    assert hit == 2


def test_hit_stops_at_the_first_absent_block() -> None:
    tokens = list(range(200))
    present = set(block_keys(tokens, 32)[:2]) | {block_keys(tokens, 32)[3]}
    keys, hit = hit_blocks(tokens, 32, present.__contains__)
    assert keys == block_keys(tokens[:192], 32) and hit == 2


def test_spans_map_full_blocks_to_vllm_blocks_and_chain_parents() -> None:
    keys = block_keys(list(range(128)), 64)
    out = spans(keys, 0, 2, [7, 3, 9, 4, 11], per_full_block=2)
    assert [s.vllm_block_ids for s in out] == [(7, 3), (9, 4)]
    assert out[0].parent == ROOT_KEY and out[1].parent == keys[0]


def test_persist_advances_once_per_full_block_and_only_over_known_tokens() -> None:
    track = RequestTrack()
    tokens = list(range(100))
    ids = list(range(10))
    # a 70-token prefill: two full blocks of 32 persist
    first = blocks_to_persist(track, tokens[:70], 70, ids, 1, 32)
    assert [b.key for b in first] == block_keys(tokens[:64], 32)
    assert blocks_to_persist(track, tokens[:71], 71, ids, 1, 32) == ()  # decode steps inside block 2
    # KV for 96 tokens exists, but only 90 ids are known (asynchronous scheduling): block 2 waits
    assert blocks_to_persist(track, tokens[:90], 96, ids, 1, 32) == ()
    third = blocks_to_persist(track, tokens[:97], 96, ids, 1, 32)
    assert [b.key for b in third] == block_keys(tokens[:96], 32)[2:] and third[0].vllm_block_ids == (2,)


def test_tensor_parallel_ranks_keep_their_own_blocks_and_endpoints() -> None:
    assert shard_dir("/kv", 0, 1) == "/kv" and shard_name("p0", 0, 1) == "p0"
    assert shard_dir("/kv", 1, 2) == "/kv/tp1of2" and shard_dir("/kv", 0, 2) == "/kv/tp0of2"
    assert shard_name("p0", 1, 2) == "p0-tp1" and shard_name("", 1, 2) == ""
