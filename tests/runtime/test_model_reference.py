"""The reference engine: greedy, deterministic, and the same tokens however the KV reached it."""

from __future__ import annotations

import torch

from dualpath.runtime.model import (
    ReferenceEngine,
    ReferenceSession,
    Transformer,
    TransformerConfig,
    layer_kv_from_buffer,
    layer_kv_to_bytes,
)


def make_engine(seed: int = 0) -> ReferenceEngine:
    config = TransformerConfig(
        vocab_size=259,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
    )
    return ReferenceEngine(Transformer.random(config, seed=seed))


def make_ids(count: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_greedy_generation_is_deterministic_and_seed_dependent() -> None:
    prompt = make_ids(40, seed=1)
    first = make_engine(seed=0).generate(prompt, 24)
    assert first == make_engine(seed=0).generate(prompt, 24)
    assert len(first) == 24
    assert first != make_engine(seed=1).generate(prompt, 24)


def test_generation_matches_argmax_of_full_recompute_at_every_step() -> None:
    engine, prompt = make_engine(), make_ids(30, seed=2)
    tokens = engine.generate(prompt, 6)
    for step in range(6):
        logits = engine.model.prefill(prompt + tokens[:step]).logits[0]
        assert int(torch.argmax(logits)) == tokens[step]


def test_cached_prefix_from_memory_or_from_bytes_gives_identical_tokens() -> None:
    engine, prompt = make_engine(), make_ids(200, seed=3)
    expected = engine.generate(prompt, 20)
    prefix_kv = engine.recompute_kv(prompt[:128])
    config = engine.model.config
    round_tripped = [layer_kv_from_buffer(bytes(layer_kv_to_bytes(kv)), 128, config) for kv in prefix_kv]
    assert engine.generate(prompt, 20, prefix_kv) == expected
    assert engine.generate(prompt, 20, round_tripped) == expected
    # A fully cached prompt still yields the same first token (its last token is recomputed).
    assert engine.generate(prompt, 20, engine.recompute_kv(prompt)) == expected


def test_stop_token_ends_generation() -> None:
    engine, prompt = make_engine(), make_ids(20, seed=4)
    tokens = engine.generate(prompt, 10)
    stop = tokens[3]
    assert engine.generate(prompt, 10, stop_token_ids=[stop]) == tokens[: tokens.index(stop) + 1]


def test_multi_round_session_reuses_kv_and_matches_fresh_generation() -> None:
    engine = make_engine()
    rounds = [(make_ids(50, seed=10 + i), 12) for i in range(3)]
    for reuse_block_tokens in (1, 64):
        session = ReferenceSession(engine, reuse_block_tokens=reuse_block_tokens)
        history: list[int] = []
        for index, (append, gen) in enumerate(rounds):
            tokens = session.run_round(append, gen)
            assert tokens == engine.generate(history + append, gen)  # no cache at all
            expected_hit = 0 if index == 0 else (len(history) - 1) // reuse_block_tokens * reuse_block_tokens
            assert session.last_hit_tokens == expected_hit
            history = history + append + tokens
        assert session.history == history


def test_kv_kept_across_rounds_matches_a_full_recompute_within_tolerance() -> None:
    engine = make_engine()
    session = ReferenceSession(engine)
    session.run_round(make_ids(40, seed=20), 10)
    session.run_round(make_ids(40, seed=21), 10)
    assert session.kv is not None
    recomputed = engine.recompute_kv(session.history[:-1])
    for kept, fresh in zip(session.kv, recomputed, strict=True):
        torch.testing.assert_close(kept, fresh, rtol=1e-5, atol=1e-5)
