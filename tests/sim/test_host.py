"""Engines on one CPU host (sim/host.py): the simulator runs them from the values it is given, no subclass."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest

from dualpath.config.loader import load_cluster
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation
from dualpath.sim.host import HostSpec

TRAJECTORIES = [t[:4] for t in load_trajectories("64k", 4, 1)]


def _config(mode: str, **host: float) -> SimConfig:
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=["hardware.gpus_per_node=1"])  # fmt: skip
    spec = HostSpec(capacity_cores=float(host.pop("capacity_cores", 64.0)), **host)
    return SimConfig(cluster=cluster, mode=mode, host=spec)


def test_fewer_cores_stretch_the_same_cpu_work() -> None:
    runs = {}
    for cores in (64.0, 0.5):
        sim = Simulation(_config("dualpath", capacity_cores=cores), TRAJECTORIES, seed=1)
        out = sim.run()
        assert sim.host is not None and all(not math.isnan(a.end_s) for a in out.agents)
        runs[cores] = (out.end_s, sim.host.cpu.cpu_s_by_thread)
    assert runs[0.5][0] > 1.5 * runs[64.0][0]
    # Every forward and decode run is CPU work on its engine's thread, charged whatever the cores.
    assert {"pe0", "de1"} <= set(runs[64.0][1])
    assert sum(runs[0.5][1].values()) > 0


def test_given_agent_starts_and_command_trips() -> None:
    starts = (0.0, 0.5, 1.0, 1.5)
    config = dataclasses.replace(_config("basic"), agent_starts_s=starts)
    sim = Simulation(config, TRAJECTORIES, seed=1)
    assert tuple(a.start_s for a in sim.agents) == starts
    quick = sim.run()
    slow = Simulation(dataclasses.replace(_config("basic", command_trip_s=0.05), agent_starts_s=starts),
                      TRAJECTORIES, seed=1).run()  # fmt: skip
    # A forward starts a trip after its command, and its first token reaches the client a trip later
    # (batching shifts with the trips, so the growth is not exactly two trips).
    ttft = [
        sum(r.first_token_s - r.arrival_s for r in o.requests.values()) / len(o.requests)
        for o in (quick, slow)
    ]
    assert ttft[1] > ttft[0] + 0.05


def test_a_copy_into_the_de_cache_takes_a_command_trip_each_way() -> None:
    from types import SimpleNamespace

    from dualpath.engine import commands as cmd
    from dualpath.sim.host import RuntimeHost
    from dualpath.sim.kernel import Simulator

    kernel, flow_s, trip_s, done = Simulator(), 0.2, 0.05, []

    def start_flow(
        size: float, path: tuple[str, ...], cls: object, then: Callable[..., None], *args: object
    ) -> None:
        assert size == 64 * 10.0 and path == ("de3",)
        kernel.schedule(flow_s, then, *args)

    sim = SimpleNamespace(
        sim=kernel, kv_bytes=10.0, net=SimpleNamespace(start_flow=start_flow),
        topo=SimpleNamespace(h2d=lambda de: (f"de{de}",)), _h2d_done=lambda rid: done.append((rid, kernel.now_s)),
    )  # fmt: skip
    host = RuntimeHost(sim, HostSpec(capacity_cores=2.0, command_trip_s=trip_s))
    host.h2d(cmd.StartH2D(de_engine=3, request_id=7, tokens=64, hit_tokens=48))
    kernel.run()
    # The command's trip to the DE's copy thread, the bytes over its CNIC, the completion's trip back.
    assert done == [(7, pytest.approx(trip_s + flow_s + trip_s))]
