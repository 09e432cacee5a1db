"""`simulate --json` keys used by `dualpath reproduce`: TTFT breakdown, attention balance, workload scales."""

from __future__ import annotations

import json

import pytest

from dualpath.cli.main import main
from dualpath.config.loader import load_cluster
from dualpath.metrics import slo_attainment, summarize_latencies
from dualpath.sim.agents import load_trajectories, scale_rounds
from dualpath.sim.driver import SimConfig, Simulation
from dualpath.sim.summary import TTFT_PARTS, summarise, to_record, ttft_parts_s


def run(mode: str, agents: int = 6, rounds: int = 20) -> dict:  # type: ignore[type-arg]
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=[])  # fmt: skip
    trajectories = [t[:rounds] for t in load_trajectories("64k", agents, 1)]
    out = Simulation(SimConfig(cluster=cluster, mode=mode), trajectories, seed=1).run()
    return summarise(out, offline=True, wall_s=0.0)


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
def test_ttft_breakdown_sums_to_mean_ttft(mode: str) -> None:
    s = run(mode)
    parts = s["ttft_breakdown_s"]
    assert set(parts) == set(TTFT_PARTS)
    assert all(v >= -1e-12 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(s["ttft_s"]["mean"], rel=1e-9)
    assert parts["prefill"] > 0
    if mode == "oracle":
        assert parts["read"] == 0 and parts["read_wait"] == 0
    else:
        assert parts["read"] > 0


@pytest.mark.parametrize("mode", ["basic", "dualpath"])
def test_summary_equals_the_per_request_records_definitions(mode: str) -> None:
    """The summary's latencies, SLO attainment and TTFT breakdown, computed from arrays of milestones,
    are exactly those of one `RequestRecord` per request (`metrics`) and of `ttft_parts_s` summed by `sum`."""
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=[])  # fmt: skip
    trajectories = [t[:12] for t in load_trajectories("64k", 24, 2)]
    out = Simulation(SimConfig(cluster=cluster, mode=mode), trajectories, seed=2).run()
    s = summarise(out, offline=True, wall_s=0.0)
    records = [to_record(i, r) for i, r in sorted(out.requests.items())]
    prefilled = [r for r in records if r.ttft_s is not None]
    assert len(prefilled) == s["requests"] > 200
    assert s["ttft_s"] == summarize_latencies(r.ttft_s for r in prefilled)
    assert s["ttst_s"] == summarize_latencies(r.ttst_s for r in prefilled)
    assert s["tpot_s"] == summarize_latencies(r.tpot_s for r in prefilled)
    assert s["slo_attainment"] == slo_attainment(prefilled)
    parts = [p for p in (ttft_parts_s(t) for t in out.requests.values()) if p is not None]
    expected = {name: sum(p[k] for p in parts) / len(parts) for k, name in enumerate(TTFT_PARTS)}
    assert s["ttft_breakdown_s"] == expected


def test_attention_balance_is_at_least_one_and_snic_bytes_per_node() -> None:
    s = run("dualpath")
    assert s["attention_max_over_avg"] >= 1.0
    # Six agents never fill all 8 GPUs of the PE node: no step counts as busy.
    assert s["attention_busy_max_over_avg"] is None
    busy = run("dualpath", agents=32, rounds=4)
    assert 1.0 <= busy["attention_busy_max_over_avg"] <= busy["attention_max_over_avg"]
    assert set(s["snic_bytes"]) == {"0", "1"}
    # Fig. 13 reads: the rx part only; the DE's persists (tx) are in snic_bytes, not here.
    assert set(s["snic_read_bytes"]) == {"0", "1"}
    assert 0 < s["snic_read_bytes"]["0"] == s["snic_bytes"]["0"]  # a PE reads and never persists
    assert 0 < s["snic_read_bytes"]["1"] < s["snic_bytes"]["1"]  # a DE also writes its new blocks
    assert s["snic_read_max_over_avg"] >= 1.0


def test_scale_rounds_multiplies_appends_and_generations() -> None:
    rounds = [[(100, 10), (3, 1)]]
    assert scale_rounds(rounds, append_scale=2.0) == [[(200, 10), (6, 1)]]
    assert scale_rounds(rounds, gen_scale=0.1) == [[(100, 1), (3, 1)]]


def test_cli_workload_scale_changes_the_replay(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--model", "ds-27b", "--p", "1", "--d", "1", "--agents", "3", "--json", "--quiet"]
    main([*base])
    one = json.loads(capsys.readouterr().out)
    main([*base, "--set", "workload.gen_scale=2"])
    two = json.loads(capsys.readouterr().out)
    assert two["tpot_s"]["mean"] > 0 and two["jct_s"] > one["jct_s"]
    assert main([*base, "--set", "workload.nonsense=2"]) == 2  # UserError: one line, exit 2
    assert "workload.nonsense" in capsys.readouterr().err
