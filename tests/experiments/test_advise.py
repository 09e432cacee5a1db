"""`dualpath advise`: the search (bisection, pruning by the planner's P/D range) on a synthetic SLO surface,
and one small real case whose choice is checked with independent `dualpath simulate` runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

from dualpath.cli.main import main
from dualpath.config.loader import load_cluster
from dualpath.experiments.advise import (
    AdviseProgress,
    Problem,
    Slo,
    binding_link,
    rank_links,
    search,
    search_steps,
    splits,
)
from dualpath.experiments.runner import RunOutcome
from dualpath.experiments.runspec import RunSpec
from dualpath.plan.bounds import pd_range


def hopper_range(*overrides: str):  # type: ignore[no-untyped-def]
    return pd_range(load_cluster(hardware="hopper-8x400g", model="ds-27b", overrides=overrides).hardware)


def test_splits_stay_inside_the_planners_range() -> None:
    rng = hopper_range()  # 1/7 <= P/D <= 7/2 (paper §4.2 worked example)
    assert (rng.pd_ratio_min, rng.pd_ratio_max) == (Fraction(1, 7), Fraction(7, 2))
    ten = splits(10, rng)
    assert sorted(ten) == [(p, 10 - p) for p in range(2, 8)]  # 1P9D (1/9) and 8P2D, 9P1D (> 7/2) pruned
    assert ten[0] == (4, 6)  # nearest the range's geometric centre (√(1/7 · 7/2) ≈ 0.71) first


def fake_runner(calls: list[RunSpec]):  # type: ignore[no-untyped-def]
    """A synthetic SLO surface: met iff P >= 3 and D >= 2, with less TTFT the more prefill nodes."""

    def fake(specs: Sequence[RunSpec]) -> dict[str, RunOutcome]:
        calls.extend(specs)
        return {s.key(): RunOutcome(spec=s, result={"ttft_s": {"p90": 4.0 / s.p if s.d >= 2 else 99.0},
                                                     "tpot_s": {"p90": 0.01}}) for s in specs}  # fmt: skip

    return fake


TEMPLATE = RunSpec(model="ds-27b", p=1, d=1, mode="dualpath", aps=1.0, duration_s=60.0)


def test_search_grows_then_bisects_to_the_smallest_cluster_and_its_best_split() -> None:
    calls: list[RunSpec] = []
    problem = Problem(template=TEMPLATE, slo=Slo(ttft_p90_s=1.5), pd_range=hopper_range(), gpus_per_node=8)
    answer = search(problem, "dualpath", fake_runner(calls), start=2, batch=2, log=lambda _: None)
    assert answer.best is not None and (answer.best.spec.p, answer.best.spec.d) == (3, 2)
    # n grows by 1, 2, 4, ... from the smallest cluster (2, 3, 5), then bisects (4).
    assert answer.nodes_checked == {2: False, 3: False, 5: True, 4: False}
    # Every split of 4 nodes was run and missed (the evidence for "one node fewer does not").
    assert {(s.p, s.d) for s in calls if s.p + s.d == 4} == {(1, 3), (2, 2), (3, 1)}
    assert all(problem.pd_range.contains(s.p, s.d) for s in calls)
    assert len(calls) == len(set(calls))  # no run twice


def test_splits_that_cannot_run_are_pruned_without_a_run() -> None:
    # As DeepSeek-V3.2 on 8-GPU nodes: one node of either role cannot hold the weights.
    def cannot_run(p: int, d: int) -> str | None:
        return "weights do not fit" if p < 2 or d < 2 else None

    calls: list[RunSpec] = []
    problem = Problem(template=TEMPLATE, slo=Slo(ttft_p90_s=1.5), pd_range=hopper_range(), gpus_per_node=8,
                      cannot_run=cannot_run)  # fmt: skip
    answer = search(problem, "dualpath", fake_runner(calls), start=2, batch=2, log=lambda _: None)
    assert answer.best is not None and (answer.best.spec.p, answer.best.spec.d) == (3, 2)
    assert all(s.p >= 2 and s.d >= 2 for s in calls)  # nothing that cannot run was run
    # 2 and 3 nodes have no split that can run: the search starts at 4 (2P2D, a miss), then 5.
    assert answer.nodes_checked == {4: False, 5: True}
    assert [(s.p, s.d) for s in calls] == [(2, 2), (2, 3), (3, 2)]
    pruned = {(e.spec.p, e.spec.d): e.pruned for e in answer.runs if e.pruned}
    assert pruned == {
        (1, 3): "weights do not fit",
        (3, 1): "weights do not fit",
        (1, 4): "weights do not fit",
    }
    rows = [e.row(problem.slo) for e in answer.runs if e.pruned]
    assert all(r["command"] is None and r["meets_slo"] is False for r in rows)


def test_search_steps_yield_batches_and_take_their_outcomes() -> None:
    calls: list[RunSpec] = []
    run = fake_runner(calls)
    problem = Problem(template=TEMPLATE, slo=Slo(ttft_p90_s=1.5), pd_range=hopper_range(), gpus_per_node=8)
    steps = search_steps(problem, "basic", start=5, batch=1, log=lambda _: None)
    first = next(steps)
    assert [(s.p, s.d, s.mode) for s in first] == [(2, 3, "basic")]  # one split at a time, from n = 5
    batches = [first]
    try:
        while True:
            batches.append(steps.send(run(batches[-1])))
    except StopIteration as done:
        answer = done.value
    assert (answer.best.spec.p, answer.best.spec.d) == (3, 2)
    assert all(len(b) == 1 for b in batches)
    assert answer.nodes_checked == {5: True, 3: False, 4: False}  # from n = 5: bisects down from there


def test_progress_shows_the_best_answer_so_far() -> None:
    slo = Slo(ttft_p90_s=1.5)
    lines: list[str] = []
    bar = AdviseProgress(["dualpath", "basic"], slo, enabled=False, log=lines.append)
    met = {"ttft_s": {"p90": 1.0}, "tpot_s": {"p90": 0.01}}
    bar.ran(RunOutcome(spec=replace(TEMPLATE, p=4, d=4), result=met))
    bar.ran(RunOutcome(spec=replace(TEMPLATE, p=3, d=3), result=met))
    bar.ran(
        RunOutcome(spec=replace(TEMPLATE, p=2, d=2), result={"ttft_s": {"p90": 9.0}, "tpot_s": {"p90": 0.01}})
    )
    assert bar.best["dualpath"] == (6, 1.0 / 1.5, "3P3D") and bar.best["basic"] is None
    assert bar.status == "dualpath: <= 6 nodes (3P3D) | basic: searching"
    bar.write("a run line")
    assert lines == ["a run line"]  # without the bar, lines go to the log


SMALL = ["--model", "ds-27b", "--dataset", "32k", "--aps", "0.5", "--duration", "120s", "--ttft-p90", "1.5s",
         "--set", "hardware.snic_bytes_per_s=25Gbps"]  # fmt: skip


def simulate(p: int, d: int, capsys) -> dict:  # type: ignore[no-untyped-def]
    """An independent run: the simulate command in this process, no cache, no early stop."""
    capsys.readouterr()
    args = ["simulate", "--model", "ds-27b", "--dataset", "32k", "--agents", "60", "--aps", "0.5",
            "--duration", "120", "--set", "hardware.snic_bytes_per_s=25Gbps", "--p", str(p), "--d", str(d),
            "--mode", "basic", "--json", "--quiet"]  # fmt: skip
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_advise_choice_meets_the_slo_and_one_node_fewer_does_not(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # SNICs slowed to 25 Gbps make storage reads the bottleneck: basic needs more than one PE node.
    argv = [
        "advise",
        *SMALL,
        "--modes",
        "basic",
        "--no-links",
        "--workers",
        "2",
        "-o",
        str(tmp_path),
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    p, d = out["basic"]["p"], out["basic"]["d"]
    assert p + d > 2, "the case must need more than the smallest cluster to test 'one node fewer'"
    chosen = simulate(p, d, capsys)
    assert chosen["ttft_s"]["p90"] <= 1.5
    assert chosen["ttft_s"]["p90"] == out["basic"]["chosen_run"]["ttft_p90_s"]
    fewer = splits(p + d - 1, hopper_range("hardware.snic_bytes_per_s=25Gbps"))
    assert {(e["p"], e["d"]) for e in out["basic"]["one_node_fewer"]} == set(fewer)
    for fp, fd in fewer:
        assert simulate(fp, fd, capsys)["ttft_s"]["p90"] > 1.5


def test_binding_link_is_ranked_from_the_runs_own_link_record() -> None:
    utilisation = {
        "node0/snic_rx": [0.97, 0.80],  # PE SNIC read, at capacity for most of the run
        "node1/snic_rx": [0.50, 0.10],
        "node2/snic_rx": [0.30, 0.00],  # a DE (2 PE nodes)
        "node2/cnic3_write": [0.40, 0.05],
        "storage_read": [0.01, 0.0],
    }
    ranked = rank_links(utilisation, num_prefill_nodes=2)
    assert ranked["link"] == "PE SNIC read"
    assert [row["link"] for row in ranked["links"]] == ["PE SNIC read", "DE CNIC write", "DE SNIC read",
                                                        "storage read"]  # fmt: skip
    assert ranked["links"][0] == {"link": "PE SNIC read", "mean_utilisation": 0.97, "time_at_95pct": 0.8}
    calm = rank_links({"node0/snic_rx": [0.6, 0.1]}, num_prefill_nodes=1)
    assert calm["link"] is None and calm["links"][0]["link"] == "PE SNIC read"  # busiest, not binding
    assert binding_link({"ttft_s": {}}, 1) is None  # a run without a link record names none
