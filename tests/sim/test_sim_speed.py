"""`benchmarks/sim_speed.py`: the per-phase run is the kernel's own loop, event for event."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("sim_speed")


def test_phases_run_the_same_events_to_the_same_end_as_the_kernel(script: ModuleType) -> None:
    # The link network moves pending completions in the kernel's heap (`Simulator.move`), which needs
    # every pop to keep the entries' places: a loop popping with plain `heapq` breaks the run.
    plain = script.case(2, 4, 24, "dualpath")
    timed = script.case(2, 4, 24, "dualpath", phases=True)
    assert timed["events"] == plain["events"] > 0
    assert timed["jct_s"] == plain["jct_s"]
    calls = {phase: row["calls"] for phase, row in timed["phases"].items()}
    updates = calls.pop("link rate update (max-min)")  # instant-end callbacks, not events
    assert updates > 0
    assert sum(calls.values()) == timed["events"]
