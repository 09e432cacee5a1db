"""Small end-to-end scenarios: the paper's orderings must hold on a storage-bound 1P1D cluster."""

from __future__ import annotations

import pytest

from dualpath.config.loader import load_cluster
from dualpath.engine.modes import MODES
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation

# Cut the SNIC (400 -> 25 Gbps) so the PE's storage read is clearly the bottleneck with few agents.
SATURATED = {"hardware.snic_bytes_per_s": "25Gbps"}


def small_sim(mode: str, *, agents: int, rounds: int, seed: int = 1, **sets: str) -> Simulation:
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=[f"{k}={v}" for k, v in sets.items()])  # fmt: skip
    trajectories = [t[:rounds] for t in load_trajectories("64k", agents, seed)]
    return Simulation(SimConfig(cluster=cluster, mode=mode), trajectories, seed=seed)


def jct(mode: str) -> float:
    out = small_sim(mode, agents=8, rounds=30, **SATURATED).run()
    return max(a.end_s for a in out.agents)


@pytest.fixture(scope="module")
def jcts() -> dict[str, float]:
    return {mode: jct(mode) for mode in MODES}


def test_dualpath_beats_basic_when_pe_snic_saturated(jcts: dict[str, float]) -> None:
    assert jcts["dualpath"] < 0.85 * jcts["basic"]


def test_oracle_is_a_lower_bound_for_every_mode(jcts: dict[str, float]) -> None:
    assert all(jcts["oracle"] <= v * 1.0001 for v in jcts.values())


def test_dualpath_reads_on_both_sides_and_balances_snics() -> None:
    out = small_sim("dualpath", agents=8, rounds=30, **SATURATED).run()
    rx = [n.snic_rx.bytes_carried(out.end_s) for n in out.topology.nodes]
    assert min(rx) > 0.25 * max(rx)
