"""Processor sharing of the host's cores (sim/host_cpu.py, what the twin runs engines on): rates, conservation, cuts."""

from __future__ import annotations

import pytest

from dualpath.sim.host_cpu import HostCpu
from dualpath.sim.kernel import Simulator


def _finishing(sim: Simulator, cpu: HostCpu, plan: list[tuple[float, str, float]]) -> dict[str, float]:
    """Submit (at time, thread, cpu seconds); return when each thread's work finished."""
    ends: dict[str, float] = {}

    def submit(thread: str, cpu_s: float) -> None:
        cpu.submit(thread, cpu_s, lambda: ends.__setitem__(thread, sim.now_s))

    for at_s, thread, cpu_s in plan:
        sim.schedule_at(at_s, submit, thread, cpu_s)
    sim.run()
    return ends


def test_a_thread_alone_runs_at_one_core() -> None:
    sim = Simulator()
    ends = _finishing(sim, HostCpu(sim, 2.0), [(0.0, "a", 1.0)])
    assert ends["a"] == pytest.approx(1.0)


def test_three_threads_on_two_cores_get_two_thirds_each() -> None:
    sim = Simulator()
    ends = _finishing(sim, HostCpu(sim, 2.0), [(0.0, t, 1.0) for t in "abc"])
    assert all(e == pytest.approx(1.5) for e in ends.values())


def test_slower_cores_stretch_every_thread_alike() -> None:
    # Cores at 0.8 of the calibration's speed: a thread alone and three sharing two cores each take 1 / 0.8
    # as long; the CPU seconds charged stay what the work costs at the calibration's speed.
    sim = Simulator()
    assert _finishing(sim, HostCpu(sim, 2.0, speed=0.8), [(0.0, "a", 1.0)])["a"] == pytest.approx(1.25)
    sim = Simulator()
    cpu = HostCpu(sim, 2.0, speed=0.8)
    ends = _finishing(sim, cpu, [(0.0, t, 1.0) for t in "abc"])
    assert all(e == pytest.approx(1.5 / 0.8) for e in ends.values())
    assert cpu.cpu_s_by_thread == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    with pytest.raises(ValueError):
        HostCpu(sim, 2.0, speed=0.0)


def test_cpu_seconds_are_conserved_when_work_arrives_later() -> None:
    # One core: a runs alone for 0.5 s, then a and b share it at half a core each.
    sim = Simulator()
    ends = _finishing(sim, HostCpu(sim, 1.0), [(0.0, "a", 1.0), (0.5, "b", 0.5)])
    assert ends["a"] == pytest.approx(1.5) and ends["b"] == pytest.approx(1.5)  # 1.5 CPU-s on one core


def test_a_light_thread_runs_at_its_weight_and_leaves_the_rest() -> None:
    # One core: the engine (weight 1) and its I/O (weight 0.25, a quarter of the engine's CPU) finish
    # together, and the engine gets 1 / 1.25 of the core meanwhile.
    sim = Simulator()
    cpu = HostCpu(sim, 1.0)
    ends: dict[str, float] = {}
    cpu.submit("de0", 1.0, lambda: ends.__setitem__("de0", sim.now_s))
    cpu.submit("de0-io", 0.25, lambda: ends.__setitem__("io", sim.now_s), weight=0.25)
    sim.run()
    assert ends["de0"] == pytest.approx(1.25) and ends["io"] == pytest.approx(1.25)
    with pytest.raises(ValueError):
        cpu.submit("x", 1.0, weight=0.0)


def test_one_thread_does_one_thing_at_a_time() -> None:
    sim = Simulator()
    cpu = HostCpu(sim, 2.0)
    ends: list[float] = []
    for _ in range(3):
        cpu.submit("serve", 0.1, lambda: ends.append(sim.now_s))
    sim.run()
    assert ends == pytest.approx([0.1, 0.2, 0.3])


def test_a_cut_ends_work_at_what_it_had() -> None:
    sim = Simulator()
    cpu = HostCpu(sim, 1.0)
    done: list[float] = []
    cpu.submit("pe0", 1.0)  # a second thread: de0 gets half a core
    work = cpu.submit("de0", 1.0, lambda: done.append(sim.now_s))
    sim.schedule_at(0.4, lambda: cpu.set_total(work, cpu.done_cpu_s(work)))  # 0.2 CPU-s had at 0.4 s
    sim.run()
    assert done == pytest.approx([0.4])
    assert cpu.cpu_s_by_thread["de0"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        HostCpu(sim, 0.0)
