"""Round by round: `bench.rounds_breakdown` and `benchmarks/runtime_paths.py`'s means and table over it."""

from __future__ import annotations

import pytest

from dualpath.runtime.bench import rounds_breakdown
from dualpath.runtime.loadgen import AgentRecord, BenchResult, RoundRecord


def record(agent: int, index: int, sent: float, done: float, times: dict[str, float]) -> RoundRecord:
    return RoundRecord(
        agent_id=agent,
        round_index=index,
        prompt_tokens=10,
        generated_tokens=2,
        sent_s=sent,
        first_token_s=sent + 0.1,
        second_token_s=done,
        done_s=done,
        info={"times_s": times},
    )


def result(records: list[RoundRecord]) -> BenchResult:
    return BenchResult(
        rounds=tuple(records), agents=(AgentRecord(agent_id=0, start_s=0.0, end_s=9.0),), wall_s=9.0
    )


def test_each_round_gets_its_own_means_and_the_wait_after_its_last_token():
    rounds = rounds_breakdown(
        result(
            [
                record(
                    0, 0, 0.0, 1.0, {"prefill_end": 0.5, "last_token": 0.9, "finished": 1.4}
                ),  # waited 0.5 s
                record(1, 0, 0.2, 1.0, {"prefill_end": 0.7, "finished": 0.8}),  # token 1 only: 0.1 s
                record(
                    0, 1, 1.5, 2.5, {"read_start": 0.2, "read_end": 0.4, "last_token": 1.0, "finished": 1.0}
                ),
            ]
        )
    )
    assert [r["round"] for r in rounds] == [0, 1] and [r["requests"] for r in rounds] == [2, 1]
    first, second = rounds
    assert first["sent_mean_s"] == pytest.approx(0.1) and first["latency_mean_s"] == pytest.approx(0.9)
    assert first["finished_after_last_token_mean_s"] == pytest.approx(0.3)
    assert first["milestones_mean_s"] == pytest.approx(
        {"prefill_end": 0.6, "last_token": 0.9, "finished": 1.1}
    )
    assert second["milestones_mean_s"]["read_end"] == pytest.approx(0.4)
    assert second["finished_after_last_token_mean_s"] == pytest.approx(0.0)


def test_a_round_without_server_times_has_no_milestones_and_no_wait():
    (only,) = rounds_breakdown(result([record(0, 0, 0.0, 1.0, {})]))
    assert only["milestones_mean_s"] == {} and only["finished_after_last_token_mean_s"] == 0.0


def test_repeated_runs_average_round_by_round_and_a_milestone_one_run_lacks_is_not_zero(runtime_paths):
    one = rounds_breakdown(
        result(
            [record(0, 0, 0.0, 1.0, {"read_start": 0.2, "read_end": 0.5, "last_token": 0.9, "finished": 1.2})]
        )
    )
    two = rounds_breakdown(result([record(0, 0, 0.2, 1.0, {"last_token": 0.8, "finished": 1.0})]))
    (mean,) = runtime_paths.rounds_result([one, two])
    assert mean["sent_mean_s"] == pytest.approx(0.1) and mean["latency_mean_s"] == pytest.approx(0.9)
    assert mean["finished_after_last_token_mean_s"] == pytest.approx(0.25)  # (0.3 + 0.2) / 2
    assert mean["milestones_mean_s"] == pytest.approx(
        {"read_start": 0.2, "read_end": 0.5, "last_token": 0.85, "finished": 1.1}
    )
    table = runtime_paths.rounds_table({"oracle": {"rounds": [mean]}, "dualpath": {"rounds": [mean]}})
    row = table.splitlines()[2].split()
    assert row == ["0", "0.10", "0.900", "0.10", "0.900", "0.200", "0.300", "0.250"]


def test_a_milestone_one_run_lacks_is_averaged_over_the_runs_that_have_it(runtime_paths):
    means = runtime_paths.mean_by_key([{"read_end": 0.4, "finished": 1.0}, {"finished": 2.0}])
    assert means == pytest.approx({"read_end": 0.4, "finished": 1.5})
    assert list(means) == ["read_end", "finished"]
