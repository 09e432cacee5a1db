"""The reproduce machinery: run specs, SLO capacity reading, report writing (on hand-made results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath.experiments.report import write_report
from dualpath.experiments.runspec import RunSpec
from dualpath.experiments.scenarios import EXPERIMENTS, capacity_aps, metric, within_slo


def summary(mean: float) -> dict[str, float]:
    return {"mean": mean, "p50": mean, "p90": mean * 1.5, "p99": mean * 2}


def test_runspec_argv_is_a_simulate_command_line() -> None:
    spec = RunSpec(
        model="ds-27b",
        p=1,
        d=1,
        mode="dualpath",
        agents=64,
        aps=0.2,
        duration_s=300,
        read_path="split",
        overrides=("workload.gen_scale=2",),
    )
    argv = spec.argv()
    assert argv[:1] == ["simulate"]
    assert argv[argv.index("--aps") + 1] == "0.2"
    assert argv[argv.index("--read-path") + 1] == "split"
    assert argv[argv.index("--set") + 1] == "workload.gen_scale=2"
    assert "--json" in argv


def test_runspec_key_changes_with_any_field() -> None:
    base = RunSpec(model="ds-27b", p=1, d=1, mode="dualpath")
    assert base.key() == RunSpec(model="ds-27b", p=1, d=1, mode="dualpath").key()
    assert base.key() != RunSpec(model="ds-27b", p=1, d=1, mode="basic").key()
    assert base.key() != RunSpec(model="ds-27b", p=1, d=1, mode="dualpath", seed=2).key()


def test_metric_reads_plain_values_and_summaries() -> None:
    result = {"jct_s": 12.5, "ttft_s": summary(2.0)}
    assert metric(result, "jct_s") == 12.5
    assert metric(result, "ttft_s", "p90") == 3.0
    assert metric(result, "missing") is None
    assert metric(None, "jct_s") is None


def test_capacity_is_highest_aps_within_slo() -> None:
    specs = [RunSpec(model="m", p=1, d=1, mode="dualpath", aps=a) for a in (0.1, 0.2, 0.3)]
    results = {
        specs[0].key(): {"ttft_s": summary(1.0), "tpot_s": summary(0.03)},
        specs[1].key(): {"ttft_s": summary(3.9), "tpot_s": summary(0.04)},
        specs[2].key(): {"ttft_s": summary(9.0), "tpot_s": summary(0.04)},
    }
    assert capacity_aps(results, specs) == (0.2, True)
    results[specs[2].key()] = {"ttft_s": summary(2.0), "tpot_s": summary(0.04)}
    assert capacity_aps(results, specs) == (0.3, False)  # the sweep never saturated


def test_tpot_over_slo_fails_even_with_fast_ttft() -> None:
    assert not within_slo({"ttft_s": summary(0.5), "tpot_s": summary(0.051)})


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_experiment_analyzes_and_reports(tmp_path: Path, name: str) -> None:
    """Feed each experiment consistent fake results (dualpath twice as fast as basic) and check the report."""
    experiment = EXPERIMENTS[name]
    results = {}
    for spec in experiment.specs(True):
        jct = {"basic": 200.0, "layerwise": 180.0, "dualpath-rr": 120.0, "dualpath": 100.0, "oracle": 95.0}
        results[spec.key()] = {
            "jct_s": jct[spec.mode] * (spec.agents or 1) / 100,
            "ttft_s": summary(1.0 if spec.mode == "dualpath" else 5.0),
            "ttst_s": summary(0.05),
            "tpot_s": summary(0.03),
            "snic_bytes": {"pe0": 1e9, "de0": 2e9},
            "snic_max_over_avg": 1.33,
            "sim_wall_s": 1.0,
            "events": 1000,
        }
    section = experiment.analyze(results, True, tmp_path / "plots")
    assert section.rows, "an experiment must produce table rows"
    assert all(len(row) == len(section.columns) for row in section.rows)
    for plot in section.plots:
        assert plot.exists() and plot.stat().st_size > 1000
    paths = write_report(tmp_path, [section], quick=True, header="test")
    report = json.loads(paths["json"].read_text())
    assert name in report["experiments"]
    assert "<table>" in paths["html"].read_text()


def test_fig7_speedup_claim_reads_basic_over_dualpath(tmp_path: Path) -> None:
    experiment = EXPERIMENTS["fig7"]
    results = {
        s.key(): {"jct_s": {"basic": 187.0, "dualpath": 100.0, "oracle": 95.0}[s.mode]}
        for s in experiment.specs(True)
    }
    section = experiment.analyze(results, True, tmp_path)
    claim = next(c for c in section.claims if c.claim_key == "offline_speedup_ds660b")
    assert claim.ours == pytest.approx(1.87)


def test_capacity_claim_is_empty_when_the_sweep_never_saturates_basic(tmp_path: Path) -> None:
    experiment = EXPERIMENTS["fig10"]
    fast = {"ttft_s": summary(0.5), "tpot_s": summary(0.02)}
    results = {s.key(): fast for s in experiment.specs(True)}
    section = experiment.analyze(results, True, tmp_path)
    assert all(c.ours is None and "did not reach" in c.note for c in section.claims)


def test_balance_sections_read_windows_and_progress_beside_round_robin(tmp_path: Path) -> None:
    """Fig. 13 reads the loaded windows' max/avg, Fig. 14 each stretch of the run, for both schedulers."""
    results = {}
    for k, spec in enumerate(EXPERIMENTS["fig13"].specs(True)):
        loaded = {"windows": 40 + k, "mean": 1.1 + k, "p50": 1.05 + k, "p90": 1.3 + k, "max": 1.6 + k}
        progress = {"0-5%": 1.2 + k, "5-20%": 1.4 + k, "20-50%": None, "50-80%": 2.0 + k, "80-100%": 3.0 + k}
        results[spec.key()] = {
            "snic_read_windows": {"window_s_median": 10.0, "all": loaded, "loaded": loaded},
            "snic_read_bytes": {"0": 3e9, "1": 1e9},
            "snic_read_max_over_avg": 1.5,
            "attention_max_over_avg": 2.5 + k,
            "attention_max_over_avg_by_progress": progress,
            "attention_busy_max_over_avg": 1.5 + k,
            "attention_busy_max_over_avg_by_progress": progress,
        }
    fig13 = EXPERIMENTS["fig13"].analyze(results, True, tmp_path)
    assert [row[0] for row in fig13.rows] == ["dualpath-rr (round robin)", "dualpath (its scheduler)"]
    assert fig13.rows[1][1:6] == [2.1, 2.05, 2.3, 2.6, 41]
    fig14 = EXPERIMENTS["fig14"].analyze(results, True, tmp_path)
    assert [row[:2] for row in fig14.rows] == [["dualpath-rr (round robin)", "all"],
                                              ["dualpath-rr (round robin)", "every GPU busy"],
                                              ["dualpath (its scheduler)", "all"],
                                              ["dualpath (its scheduler)", "every GPU busy"]]  # fmt: skip
    assert fig14.rows[2][2:] == [2.2, 2.4, None, 3.0, 4.0, 3.5]
