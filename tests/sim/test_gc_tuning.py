"""The collector is off only while a run is on, and a run makes no reference cycles for it to find."""

from __future__ import annotations

import gc

import pytest

from dualpath.config.loader import load_cluster
from dualpath.engine.modes import MODES
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation
from dualpath.sim.gc_tuning import held_back_gc


def test_the_collector_is_off_inside_and_back_on_after() -> None:
    assert gc.isenabled()
    with held_back_gc():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_is_back_on_when_the_run_raises() -> None:
    with pytest.raises(RuntimeError), held_back_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with held_back_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def _small(mode: str, **config: object) -> Simulation:
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=2,
                           overrides=[])  # fmt: skip
    trajectories = [t[:12] for t in load_trajectories("64k", 8, 1)]
    return Simulation(SimConfig(cluster=cluster, mode=mode, **config), trajectories, seed=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "config"),
    [(m, {}) for m in MODES]
    + [
        ("dualpath", {"read_path": "split"}),
        ("dualpath", {"aps": 2.0, "duration_s": 60.0, "record_links": True}),
    ],
)
def test_a_run_makes_no_reference_cycles(mode: str, config: dict[str, object]) -> None:
    """What lets `held_back_gc` switch the collector off: every object a run makes is freed by reference
    counting, so the collector would find nothing. A change that makes cycles fails here."""
    sim = _small(mode, **config)
    gc.collect()
    sim.run()
    assert sim.sim.events_processed > 100
    assert gc.collect() == 0


def test_what_the_run_made_is_not_left_for_a_young_scan() -> None:
    """The run's results go to the oldest generation unscanned, so re-enabling the collector does not scan
    all of them at the next allocation."""
    with held_back_gc():
        kept = [[i] for i in range(50_000)]
        assert gc.get_count()[0] > 50_000
    assert gc.get_count()[0] < 1_000
    assert len(kept) == 50_000


def test_a_cycle_made_during_the_run_is_collected_afterwards() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    with held_back_gc():
        Node()
    assert gc.collect() >= 1
