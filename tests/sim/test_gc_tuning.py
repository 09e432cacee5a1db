"""The collector is held back only while a run is on, and a run's results do not depend on it."""

from __future__ import annotations

import gc

from dualpath.sim.gc_tuning import RUN_GEN0_THRESHOLD, held_back_gc


def test_settings_are_restored_after_the_run() -> None:
    before = gc.get_threshold()
    with held_back_gc():
        assert gc.get_threshold()[0] == RUN_GEN0_THRESHOLD
        assert gc.get_freeze_count() > 0  # what existed before the run is out of the collector's view
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_settings_are_restored_when_the_run_raises() -> None:
    before = gc.get_threshold()
    try:
        with held_back_gc():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cycles_made_during_the_run_are_still_collected() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    with held_back_gc():
        Node()
        assert gc.collect() >= 1  # the cycle is garbage and an explicit collection finds it
