"""`dualpath advise`: the search (bisection, pruning by the planner's P/D range) on a synthetic SLO surface,
and one small real case whose choice is checked with independent `dualpath simulate` runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from dualpath.cli.main import main
from dualpath.config.loader import load_cluster
from dualpath.experiments.advise import Problem, Slo, search, splits
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


def test_search_bisects_to_the_smallest_cluster_and_its_best_split() -> None:
    # A synthetic SLO surface: met iff P >= 3 and D >= 2, with less TTFT the more prefill nodes.
    calls: list[RunSpec] = []

    def fake(specs: Sequence[RunSpec]) -> dict[str, RunOutcome]:
        calls.extend(specs)
        return {s.key(): RunOutcome(spec=s, result={"ttft_s": {"p90": 4.0 / s.p if s.d >= 2 else 99.0},
                                                     "tpot_s": {"p90": 0.01}}) for s in specs}  # fmt: skip

    template = RunSpec(model="ds-27b", p=1, d=1, mode="dualpath", aps=1.0, duration_s=60.0)
    problem = Problem(template=template, slo=Slo(ttft_p90_s=1.5), pd_range=hopper_range(), gpus_per_node=8)
    answer = search(problem, "dualpath", fake, start=2, batch=2, log=lambda _: None)
    assert answer.best is not None and (answer.best.spec.p, answer.best.spec.d) == (3, 2)
    assert answer.nodes_checked == {2: False, 4: False, 8: True, 6: True, 5: True}
    # Every split of 4 nodes was run and missed (the evidence for "one node fewer does not").
    assert {(s.p, s.d) for s in calls if s.p + s.d == 4} == {(1, 3), (2, 2), (3, 1)}
    assert all(problem.pd_range.contains(s.p, s.d) for s in calls)
    assert len(calls) == len(set(calls))  # no run twice


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
