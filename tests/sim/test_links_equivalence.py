"""The fast LinkNetwork against the original per-flow one (`ReferenceLinkNetwork`) on random scenarios.

Each scenario: random links (capacities, latencies), flows over random 1–4-link paths drawn from a small
pool (so many flows share a path and form groups) and from all links, random sizes, classes, start
times and extra latencies, aborts, and flows started from `on_done` (as the driver does). Completion
times must match within 1e-6 relative; bytes carried per link within 1e-6.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from links_reference import ReferenceLinkNetwork  # tests/sim/links_reference.py, the test-only oracle

from dualpath.sim.kernel import Simulator
from dualpath.sim.links import LinkNetwork, TrafficClass

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class FlowPlan:
    flow_id: int
    start_s: float
    size_bytes: float
    path: tuple[int, ...]
    traffic_class: TrafficClass
    extra_latency_s: float
    abort_s: float | None  # absolute abort time, None: never
    follow_on: int | None  # flow id started from this flow's on_done


@dataclass(frozen=True, kw_only=True)
class Scenario:
    capacities_bytes_per_s: tuple[float, ...]
    latencies_s: tuple[float, ...]
    flows: tuple[FlowPlan, ...]


def make_scenario(seed: int, *, high_fraction: float) -> Scenario:
    rng = random.Random(seed)
    num_links = rng.randint(2, 10)
    caps = tuple(rng.choice([1, 2, 5, 10, 50]) * GB * rng.uniform(0.5, 1.5) for _ in range(num_links))
    lats = tuple(rng.choice([0.0, 0.0, 1e-6, 1e-3]) for _ in range(num_links))

    def random_path() -> tuple[int, ...]:
        return tuple(rng.sample(range(num_links), rng.randint(1, min(4, num_links))))

    pool = [random_path() for _ in range(rng.randint(1, 6))]
    num_flows = rng.randint(5, 80)
    flows = []
    follow_ons = set(rng.sample(range(1, num_flows), k=num_flows // 5)) if num_flows > 1 else set()
    for i in range(num_flows):
        flows.append(
            FlowPlan(
                flow_id=i,
                start_s=rng.choice([0.0, rng.uniform(0, 2.0), round(rng.uniform(0, 2.0), 1)]),
                size_bytes=rng.choice([0.0, rng.uniform(0.01, 5) * GB, 1 * GB])
                if rng.random() < 0.9
                else 2 * GB,
                path=rng.choice(pool) if rng.random() < 0.7 else random_path(),
                traffic_class=TrafficClass.HIGH if rng.random() < high_fraction else TrafficClass.LOW,
                extra_latency_s=rng.choice([0.0, 0.0, 1e-6]),
                abort_s=rng.uniform(0, 3.0) if rng.random() < 0.1 else None,
                follow_on=(i + 1) if (i + 1) in follow_ons else None,
            )
        )
    return Scenario(capacities_bytes_per_s=caps, latencies_s=lats, flows=tuple(flows))


def run(scenario: Scenario, network_class: type) -> tuple[dict[int, float], list[float]]:
    sim = Simulator()
    net = network_class(sim, high_priority_share=0.99)
    links = [
        net.add_link(f"l{i}", cap, latency_s=lat)
        for i, (cap, lat) in enumerate(
            zip(scenario.capacities_bytes_per_s, scenario.latencies_s, strict=True)
        )
    ]
    finished: dict[int, float] = {}
    handles: dict[int, object] = {}
    by_id = {p.flow_id: p for p in scenario.flows}
    chained = {p.follow_on for p in scenario.flows if p.follow_on is not None}

    def start(plan: FlowPlan) -> None:
        path = [links[i] for i in plan.path]
        handles[plan.flow_id] = net.start_flow(
            plan.size_bytes, path, plan.traffic_class, done, plan, extra_latency_s=plan.extra_latency_s
        )

    def done(plan: FlowPlan) -> None:
        finished[plan.flow_id] = sim.now_s
        if plan.follow_on is not None:
            start(by_id[plan.follow_on])

    def abort(flow_id: int) -> None:
        if flow_id in handles:
            net.abort_flow(handles[flow_id])

    for plan in scenario.flows:
        if plan.flow_id not in chained:
            sim.schedule_at(plan.start_s, start, plan)
        if plan.abort_s is not None:
            sim.schedule_at(plan.abort_s, abort, plan.flow_id)
    sim.run()
    return finished, [link.bytes_carried(sim.now_s) for link in links]


def assert_same(seed: int, *, high_fraction: float) -> None:
    scenario = make_scenario(seed, high_fraction=high_fraction)
    fast_done, fast_bytes = run(scenario, LinkNetwork)
    ref_done, ref_bytes = run(scenario, ReferenceLinkNetwork)
    assert fast_done.keys() == ref_done.keys(), f"seed {seed}: different flows completed"
    for flow_id, t in ref_done.items():
        assert fast_done[flow_id] == pytest.approx(t, rel=1e-6, abs=1e-12), f"seed {seed}, flow {flow_id}"
    assert fast_bytes == pytest.approx(ref_bytes, rel=1e-6, abs=1.0), f"seed {seed}: bytes carried"


@pytest.mark.parametrize("seed", range(150))
def test_single_class_matches_reference(seed: int) -> None:
    assert_same(seed, high_fraction=0.0)


@pytest.mark.parametrize("seed", range(1000, 1100))
def test_two_classes_match_reference(seed: int) -> None:
    assert_same(seed, high_fraction=0.3)


def test_scenarios_exercise_sharing_aborts_and_chains() -> None:
    # Guard against a generator that silently stopped producing the interesting cases.
    scenarios = [make_scenario(s, high_fraction=0.3) for s in range(50)]
    flows = [p for s in scenarios for p in s.flows]
    assert sum(p.abort_s is not None for p in flows) > 20
    assert sum(p.follow_on is not None for p in flows) > 50
    assert sum(p.traffic_class is TrafficClass.HIGH for p in flows) > 100
    done, _ = run(scenarios[0], LinkNetwork)
    assert done


def closed_loop(
    network_class: type,
    *,
    seed: int,
    concurrency: int,
    count: int,
    nodes: int = 2,
    high_fraction: float = 0.05,
) -> list[tuple[float, int]]:
    """The benchmark's shape: 2 nodes x 4 GPUs, reads and cross-node copies; each completion starts the
    next flow. Returns (completion time, flow id) in completion order. With more nodes, copies go
    GPU i to GPU i of every other node (the simulator's CNIC paths), as in a cluster of tens of nodes."""
    sim = Simulator()
    net = network_class(sim, high_priority_share=0.99)
    rng = random.Random(seed)
    storage = net.add_link("storage", 60 * GB)
    snic = [net.add_link(f"n{n}/snic_rx", 50 * GB) for n in range(nodes)]
    dram = [net.add_link(f"n{n}/dram", 120 * GB) for n in range(nodes)]
    tx = [[net.add_link(f"n{n}/cnic{i}_tx", 50 * GB) for i in range(4)] for n in range(nodes)]
    rx = [[net.add_link(f"n{n}/cnic{i}_rx", 50 * GB) for i in range(4)] for n in range(nodes)]
    paths = [[storage, snic[n], dram[n]] for n in range(nodes)]
    if nodes == 2:
        paths += [
            [dram[n], tx[n][i], rx[1 - n][j], dram[1 - n]]
            for n in range(2)
            for i in range(4)
            for j in range(4)
        ]
    else:
        paths += [
            [dram[n], tx[n][i], rx[m][i]]
            for n in range(nodes)
            for m in range(nodes)
            if m != n
            for i in range(4)
        ]
    log: list[tuple[float, int]] = []
    started = 0

    def start() -> None:
        nonlocal started
        if started < count:
            started += 1
            cls = TrafficClass.HIGH if rng.random() < high_fraction else TrafficClass.LOW
            net.start_flow(rng.uniform(0.1, 2.0) * GB, rng.choice(paths), cls, done, started)

    def done(flow_id: int) -> None:
        log.append((sim.now_s, flow_id))
        start()

    for _ in range(concurrency):
        start()
    sim.run()
    return log


def test_closed_loop_cluster_matches_reference() -> None:
    fast = closed_loop(LinkNetwork, seed=7, concurrency=96, count=700)
    ref = closed_loop(ReferenceLinkNetwork, seed=7, concurrency=96, count=700)
    assert len(fast) == len(ref) == 700
    ref_at = {flow_id: t for t, flow_id in ref}
    for t, flow_id in fast:
        assert t == pytest.approx(ref_at[flow_id], rel=1e-6)


def test_many_node_cluster_matches_reference() -> None:
    # 12 nodes: hundreds of groups over ~100 links; one class only, the incremental update's case.
    fast = closed_loop(LinkNetwork, seed=3, concurrency=300, count=1500, nodes=12, high_fraction=0.0)
    ref = closed_loop(ReferenceLinkNetwork, seed=3, concurrency=300, count=1500, nodes=12, high_fraction=0.0)
    assert len(fast) == len(ref) == 1500
    ref_at = {flow_id: t for t, flow_id in ref}
    for t, flow_id in fast:
        assert t == pytest.approx(ref_at[flow_id], rel=1e-6)


def test_flows_sharing_a_path_need_one_pending_event() -> None:
    # Processor sharing per group: 200 flows on one link keep one completion event, not 200.
    sim = Simulator()
    net = LinkNetwork(sim)
    link = net.add_link("snic_rx", 50 * GB)
    for i in range(200):
        net.start_flow((1 + i) * 0.01 * GB, [link], TrafficClass.LOW, lambda: None)
    sim.run(max_events=50)
    assert net.flows_completed >= 20  # each completion is followed by one rate update
    assert link.num_flows == 200 - net.flows_completed
    assert sim.pending_entries() <= 3
    sim.run()
    assert net.flows_completed == 200
    assert link.bytes_carried(sim.now_s) == pytest.approx(sum((1 + i) * 0.01 * GB for i in range(200)))


@pytest.mark.parametrize("seed", range(40))
def test_cached_top_rate_is_exact_after_every_event(seed: int) -> None:
    # The bottleneck checks read each link's cached largest group rate; stale (< 0) or exact, never wrong.
    scenario = make_scenario(seed, high_fraction=0.0 if seed % 2 else 0.3)
    sim = Simulator()
    net = LinkNetwork(sim, high_priority_share=0.99)
    links = [net.add_link(f"l{i}", cap) for i, cap in enumerate(scenario.capacities_bytes_per_s)]
    flows = {}
    for plan in scenario.flows:
        path = [links[i] for i in plan.path]
        sim.schedule_at(
            plan.start_s,
            lambda p=plan, path=path: flows.__setitem__(
                p.flow_id, net.start_flow(p.size_bytes, path, p.traffic_class, lambda: None)
            ),
        )
        if plan.abort_s is not None:
            sim.schedule_at(plan.abort_s, lambda i=plan.flow_id: i in flows and net.abort_flow(flows[i]))
    checked = 0
    while sim.run(max_events=1):
        for link in links:
            if link.top_rate >= 0.0:
                assert link.top_rate == max((g.rate for g in link.groups), default=0.0), link
                checked += 1
    assert checked > 0
