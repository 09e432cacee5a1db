"""`sample_next` and `finish_reason`: greedy is argmax, seeded draws reproduce, filters and penalties act."""

from __future__ import annotations

import torch

from dualpath.runtime.sampling import SamplingParams, draw_seed, finish_reason, sample_next


def _logits(seed: int = 0, vocab: int = 64) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_with_ties_to_the_lowest_id() -> None:
    row = _logits()
    assert sample_next(row, SamplingParams(), [], 0) == int(torch.argmax(row))
    tied = torch.zeros(10)
    tied[[3, 7]] = 1.0
    assert sample_next(tied, SamplingParams(), [], 5) == 3
    assert sample_next(row.to(torch.bfloat16), SamplingParams(), [], 0) == int(
        torch.argmax(row.to(torch.bfloat16))
    )


def test_a_seed_gives_the_same_draw_at_a_position_and_different_draws_elsewhere() -> None:
    row = _logits(1)
    params = SamplingParams(temperature=1.5, seed=42)
    draws = [sample_next(row, params, [], position) for position in range(40)]
    assert draws == [sample_next(row, params, [], position) for position in range(40)]
    assert len(set(draws)) > 5  # a flat-ish distribution: positions draw independently
    other = [sample_next(row, SamplingParams(temperature=1.5, seed=43), [], p) for p in range(40)]
    assert other != draws
    assert draw_seed(42, 0) != draw_seed(42, 1) != draw_seed(43, 0)


def test_draws_follow_the_distribution() -> None:
    row = torch.tensor([0.0, 1.0, 2.0])
    params = SamplingParams(temperature=1.0, seed=7)
    counts = torch.bincount(torch.tensor([sample_next(row, params, [], p) for p in range(3000)]), minlength=3)
    expected = torch.softmax(row, 0) * 3000
    assert torch.all((counts - expected).abs() < 0.1 * 3000), (counts, expected)


def test_top_k_top_p_and_min_p_keep_only_the_likely_tokens() -> None:
    row = _logits(2)
    order = torch.argsort(row, descending=True).tolist()
    hot = SamplingParams(temperature=5.0, seed=1)
    assert {
        sample_next(row, SamplingParams(temperature=5.0, top_k=3, seed=1), [], p) for p in range(200)
    } <= set(order[:3])
    assert {
        sample_next(row, SamplingParams(temperature=5.0, top_p=1e-6, seed=1), [], p) for p in range(50)
    } == {order[0]}
    assert {
        sample_next(row, SamplingParams(temperature=1.0, min_p=0.999, seed=1), [], p) for p in range(50)
    } == {order[0]}
    assert len({sample_next(row, hot, [], p) for p in range(200)}) > 3


def test_penalties_push_down_tokens_already_generated() -> None:
    row = torch.tensor([5.0, 4.5, 0.0])
    assert sample_next(row, SamplingParams(presence_penalty=1.0), [0], 3) == 1
    assert sample_next(row, SamplingParams(frequency_penalty=0.3), [0], 3) == 0  # 5 - 0.3 > 4.5
    assert sample_next(row, SamplingParams(frequency_penalty=0.3), [0, 0], 4) == 1  # 5 - 0.6 < 4.5


def test_min_tokens_masks_eos_and_stop_ids_and_finish_reason_says_why() -> None:
    row = torch.tensor([0.0, 9.0, 1.0, 2.0])  # EOS (1) is the argmax
    params = SamplingParams(eos_token_ids=(1,), stop_token_ids=(3,), min_tokens=2)
    assert sample_next(row, params, [], 0) == 2  # EOS and the stop id masked: token 2
    assert sample_next(row, params, [2, 2], 2) == 1
    assert sample_next(row, SamplingParams(eos_token_ids=(1,), ignore_eos=True, min_tokens=5), [], 0) == 1
    assert finish_reason(params, [2, 2, 1], 10) == "stop"
    assert finish_reason(params, [2, 1], 10) is None  # one token before it: min_tokens not reached
    assert finish_reason(params, [2, 2, 3], 10) == "stop"
    assert finish_reason(params, [2, 2, 2], 3) == "length"
    assert finish_reason(params, [2, 2, 1], 3) == "stop"  # stop wins at the length limit, as in vLLM
    assert finish_reason(SamplingParams(eos_token_ids=(1,), ignore_eos=True), [1], 5) is None


def test_params_cross_a_json_message_with_the_models_eos_and_a_seed() -> None:
    params = SamplingParams(temperature=0.7, stop_token_ids=(3, 4)).with_model(eos_token_ids=[9], seed=11)
    assert params.seed == 11 and params.eos_token_ids == (9,)
    assert SamplingParams.from_message(params.to_message()) == params
    assert SamplingParams(seed=5).with_model(eos_token_ids=[], seed=11).seed == 5
