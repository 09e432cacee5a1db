"""A node's start-up measurements for β and the §6.4 quota (runtime/model_host.py)."""

from __future__ import annotations

import time

import pytest
import torch

from dualpath.runtime.model_host import (
    _engine_seconds,
    build_model,
    measure_attention_s_per_token_pair,
    measure_prefill_tokens_per_s,
)


@pytest.fixture
def one_thread():  # type: ignore[no-untyped-def]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_an_engine_is_timed_by_its_own_cpu_not_by_the_wall(one_thread) -> None:  # type: ignore[no-untyped-def]
    # Waiting (for a core, or here asleep) is not the engine's time.
    assert _engine_seconds(lambda: time.sleep(0.03)) < 0.01
    spin_end = [0.0]

    def spin() -> None:
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            spin_end[0] += 1

    assert 0.001 < _engine_seconds(spin) <= 0.025  # at most its wall time, however busy the host


def test_start_up_rates_are_positive_and_the_pair_cost_is_small(one_thread) -> None:  # type: ignore[no-untyped-def]
    model = build_model("tiny-llama", device="cpu", seed=0)
    rate = measure_prefill_tokens_per_s(model)
    pair_s = measure_attention_s_per_token_pair(model)
    assert rate > 100.0
    assert 0.0 <= pair_s < 1.0 / rate  # one more cached token costs a new token less than the token itself
