"""`simulate --fail`: a node that dies mid-run is re-planned by the core (`ClusterCore.on_node_down`), every
agent still finishes, and the run reports the JCT cost against the same run without the failure."""

from __future__ import annotations

import json
import math

import pytest

from dualpath.cli.main import main
from dualpath.config.loader import load_cluster
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation


def _sim(mode: str, failures: tuple[tuple[int, float, float | None], ...]) -> Simulation:
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=2, num_decode_nodes=2)
    trajectories = [t[:12] for t in load_trajectories("64k", 12, 1)]
    config = SimConfig(cluster=cluster, mode=mode, failures=failures, keep_decisions=True)
    return Simulation(config, trajectories, seed=1)


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
@pytest.mark.parametrize("node", [0, 2])  # p0, d0 (ids: PEs 0..1, DEs 2..3)
def test_a_node_that_dies_for_good_costs_time_but_loses_no_agent(mode: str, node: int) -> None:
    calm = _sim(mode, ()).run()
    sim = _sim(mode, ((node, 1.5, None),))  # the calm run ends at ≈ 4 s
    out = sim.run()
    assert all(not math.isnan(a.end_s) for a in out.agents)  # every agent finished
    assert [a.next_round for a in out.agents] == [a.next_round for a in calm.agents]
    assert out.core.active_requests == 0 and out.core.down == {node}
    out.core.check_invariants()
    ((at_s, failed, replanned),) = sim.failure_log
    assert (at_s, failed) == (1.5, node) and (replanned > 0 or node < 2)  # a DE always decodes then
    assert all(a.pe_engine is None or out.core.node_of_engine(a.pe_engine) != node
               for a in out.log.assignments[-20:])  # fmt: skip
    assert max(a.end_s for a in out.agents) >= max(a.end_s for a in calm.agents) - 1e-9


def test_a_node_that_rejoins_is_placed_on_again() -> None:
    sim = _sim("dualpath", ((3, 0.8, 0.7),))  # d1 down from 0.8 s to 1.5 s
    out = sim.run()
    assert out.core.down == set() and out.core.active_requests == 0
    late = [t for t in sim.times.values() if t.arrival_s > 1.6]
    assert any(t.de_engine is not None and out.core.node_of_engine(t.de_engine) == 3 for t in late)


def test_simulate_fail_reports_the_jct_cost(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--p", "1", "--d", "2", "--agents", "8", "--quiet", "--json", "--model", "ds-27b",
            "--fail", "d1@1s"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["failures"][0]["node"] == "d1" and out["failures"][0]["at_s"] == 1.0
    assert out["failure_jct_cost_s"] == pytest.approx(out["jct_s"] - out["jct_without_failures_s"])


def test_a_bad_fail_spec_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--p", "1", "--d", "2", "--agents", "2", "--quiet", "--fail", "d2@5s"]) != 0
    assert "d0..d1" in capsys.readouterr().err
