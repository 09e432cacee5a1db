"""The online early stop (sim/early_stop.py): when it fires, what it reports, what it leaves alone."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dualpath.config.loader import load_cluster
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation
from dualpath.sim.early_stop import EarlyStop, EarlyStopWatch, TtftP90Watch
from dualpath.sim.summary import summarise

RULE = EarlyStop(ttft_slo_s=4.0, factor=2.0, window_first_tokens=32)


def online(aps: float, early_stop: EarlyStop | None, p90_s: float | None = None) -> tuple[Simulation, dict]:  # type: ignore[type-arg]
    # A 1P1D cluster with a cut SNIC: 2 APS is far past what it serves, 0.05 APS well within the SLO.
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=["hardware.snic_bytes_per_s=25Gbps"])  # fmt: skip
    trajectories = [t[:20] for t in load_trajectories("64k", round(aps * 300), 1)]
    config = SimConfig(cluster=cluster, mode="basic", aps=aps, duration_s=300.0, early_stop=early_stop,
                       stop_p90_ttft_s=p90_s, keep_decisions=True)  # fmt: skip
    sim = Simulation(config, trajectories, seed=1)
    return sim, summarise(sim.run(), offline=False, wall_s=0.0)


def test_watch_waits_for_a_full_window() -> None:
    watch = EarlyStopWatch(EarlyStop(ttft_slo_s=1.0, factor=2.0, window_first_tokens=4))
    assert [watch.first_token(100.0, t) for t in range(3)] == [None, None, None]
    reason = watch.first_token(100.0, 3.0)
    assert reason is not None and "last 4 first tokens" in reason


def test_watch_needs_the_recent_and_the_overall_mean_past_the_slo() -> None:
    watch = EarlyStopWatch(EarlyStop(ttft_slo_s=1.0, factor=2.0, window_first_tokens=2))
    for _ in range(20):
        assert watch.first_token(0.1, 0.0) is None  # a long good start keeps the overall mean low
    assert watch.first_token(5.0, 1.0) is None  # recent mean 2.55 > 2, overall still < 1
    assert watch.first_token(1.9, 1.0) is None  # recent mean 3.45 > 2, overall 0.40 < 1
    watch = EarlyStopWatch(EarlyStop(ttft_slo_s=1.0, factor=2.0, window_first_tokens=2))
    assert watch.first_token(1.5, 0.0) is None
    assert watch.first_token(2.5, 0.0) is None  # recent mean 2.0 is not > 2 x SLO
    assert watch.first_token(3.0, 0.0) is not None


def test_rule_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        EarlyStop(factor=0.5)
    with pytest.raises(ValueError):
        EarlyStop(window_first_tokens=0)


def test_saturated_run_stops_early_and_says_why() -> None:
    sim, full = online(2.0, None)
    stopped_sim, stopped = online(2.0, RULE)
    assert not full["stopped_early"] and full["stop_reason"] is None
    assert full["ttft_s"]["mean"] > RULE.ttft_slo_s  # the full run does miss the SLO
    assert stopped["stopped_early"] and "SLO" in stopped["stop_reason"]
    assert stopped["sim_end_s"] < 0.5 * full["sim_end_s"]
    assert stopped["ttft_s"]["mean"] > RULE.ttft_slo_s  # the stopped run fails on its own numbers
    # Stopping changes nothing before the stop: the decisions made are a prefix of the full run's.
    prefix = stopped_sim.log.entries
    assert prefix == sim.log.entries[: len(prefix)]


def test_run_within_slo_never_stops_and_is_unchanged() -> None:
    _, plain = online(0.05, None)
    _, watched = online(0.05, RULE)
    assert not watched["stopped_early"]
    assert {k: v for k, v in watched.items() if k != "sim_wall_s"} == {
        k: v for k, v in plain.items() if k != "sim_wall_s"
    }


def test_reproduce_counts_a_stopped_run_as_missing_the_slo(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from dualpath.experiments.runner import _run_one
    from dualpath.experiments.runspec import RunSpec
    from dualpath.experiments.scenarios import slo_cell, within_slo

    base = dict(model="ds-27b", p=1, d=1, mode="basic", agents=600, aps=2.0, duration_s=300.0,
                overrides=("hardware.snic_bytes_per_s=25Gbps",))  # fmt: skip
    plain, watched = RunSpec(**base), RunSpec(**base, early_stop_ttft_s=4.0)  # type: ignore[arg-type]
    assert "--early-stop-ttft-s" not in plain.argv() and watched.argv()[-2:] == ["--early-stop-ttft-s", "4"]
    assert watched.key() != plain.key()  # results can differ: a different cache entry
    outcome = _run_one(watched, tmp_path)
    assert outcome.result is not None, outcome.error
    assert outcome.result["stopped_early"] and outcome.result["sim_end_s"] < 300.0
    assert not within_slo(outcome.result)
    assert slo_cell(outcome.result).startswith("no (stopped early")
    good = {"ttft_s": {"mean": 1.0}, "tpot_s": {"mean": 0.01}}
    assert within_slo(good) and not within_slo({**good, "stopped_early": True})


def test_p90_watch_fires_only_once_no_completion_can_save_the_p90() -> None:
    # Whatever values still come (at most max_first_tokens in all), numpy's p90 stays over the target.
    rng = random.Random(7)
    fired = 0
    for _ in range(300):
        total = rng.randint(1, 60)
        watch = TtftP90Watch(1.0, total)
        seen: list[float] = []
        for i in range(rng.randint(1, total)):
            ttft = rng.choice([0.5, 2.0, 1.0, 3.0])
            seen.append(ttft)
            if watch.first_token(ttft, float(i)) is not None:
                best_case = seen + [0.0] * (total - len(seen))  # every first token left is instant
                assert all(np.percentile(best_case[:n], 90) > 1.0 for n in range(len(seen), total + 1))
                fired += 1
                break
    assert fired > 50  # the check above ran


def test_p90_watch_counts_first_tokens_over_the_target() -> None:
    watch = TtftP90Watch(4.0, 100)  # p90 index floor(0.9 * 99) = 89: 11 over it settle it, 12 with the margin
    assert watch.needed == 12
    assert all(watch.first_token(4.0, 0.0) is None for _ in range(50))  # at the target is within it
    assert [watch.first_token(5.0, 0.0) for _ in range(11)] == [None] * 11
    reason = watch.first_token(5.0, 9.0)
    assert reason is not None and "certainly > 4 s" in reason
    with pytest.raises(ValueError):
        TtftP90Watch(0.0, 10)


def test_run_past_the_p90_target_stops_once_the_verdict_is_settled() -> None:
    sim, full = online(2.0, None)
    stopped_sim, stopped = online(2.0, None, p90_s=4.0)
    assert full["ttft_s"]["p90"] > 4.0 and not full["stopped_early"]
    assert stopped["stopped_early"] and "certainly" in stopped["stop_reason"]
    assert stopped["sim_end_s"] < full["sim_end_s"]
    assert stopped["ttft_s"]["p90"] > 4.0
    prefix = stopped_sim.log.entries
    assert prefix == sim.log.entries[: len(prefix)]


def test_run_within_the_p90_target_is_unchanged_by_the_watch() -> None:
    _, plain = online(0.05, None)
    _, watched = online(0.05, None, p90_s=4.0)
    assert plain["ttft_s"]["p90"] <= 4.0
    assert {k: v for k, v in watched.items() if k != "sim_wall_s"} == {
        k: v for k, v in plain.items() if k != "sim_wall_s"
    }
