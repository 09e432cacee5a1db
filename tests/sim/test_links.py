"""Fluid links: oracle tests against closed forms (STYLE habit 11)."""

from __future__ import annotations

import pytest

from dualpath.sim.kernel import Simulator
from dualpath.sim.links import LinkNetwork, TrafficClass, resample_utilisation
from dualpath.sim.links_fill import FREE_SLOT, FlowGroup

GB = 1e9
HIGH, LOW = TrafficClass.HIGH, TrafficClass.LOW


def make_net(**kwargs: object) -> tuple[Simulator, LinkNetwork, dict[str, float]]:
    sim = Simulator()
    net = LinkNetwork(sim, **kwargs)  # type: ignore[arg-type]
    return sim, net, {}


def done_at(sim: Simulator, finished: dict[str, float], name: str) -> None:
    finished[name] = sim.now_s


def test_one_flow_on_an_idle_link_takes_bytes_over_bandwidth_plus_latency() -> None:
    sim, net, fin = make_net()
    link = net.add_link("snic_rx", 50 * GB, latency_s=1e-6)
    net.start_flow(100 * GB, [link], LOW, done_at, sim, fin, "a", extra_latency_s=2e-6)
    sim.run()
    assert fin["a"] == pytest.approx(2.0 + 3e-6, rel=1e-12)
    assert link.bytes_carried(sim.now_s) == pytest.approx(100 * GB)


def test_a_one_argument_transfer_finishes_as_the_same_transfer_with_its_argument_in_a_tuple() -> None:
    # `start_flow_one(size, path, class, on_done, arg)` is `start_flow(size, path, class, on_done, arg)`:
    # the same finish times for the same flows started in the same order, the argument passed as is.
    finished: dict[str, list[tuple[object, float]]] = {"tuple": [], "one": []}
    for kind in ("tuple", "one"):
        sim, net, _ = make_net()
        path = (net.add_link("snic_rx", 50 * GB, latency_s=1e-6), net.add_link("dram", 80 * GB))

        def done(arg: object, log: list[tuple[object, float]] = finished[kind], sim: Simulator = sim) -> None:
            log.append((arg, sim.now_s))

        for i, size in enumerate((30 * GB, 0.0, 70 * GB)):
            arg = ("part", i)
            if kind == "tuple":
                net.start_flow(size, path, LOW, done, arg)
            else:
                net.start_flow_one(size, path, LOW, done, arg)
        sim.run()
    assert finished["one"] == finished["tuple"] and len(finished["one"]) == 3
    assert [arg for arg, _ in finished["one"]] == [("part", 1), ("part", 0), ("part", 2)]
    sim, net, _ = make_net()
    link = net.add_link("l", GB)
    with pytest.raises(ValueError, match=">= 0"):
        net.start_flow_one(-1.0, (link,), LOW, print, "x")
    with pytest.raises(ValueError, match="at least one link"):
        net.start_flow_one(1.0, (), LOW, print, "x")


def test_zero_byte_flow_completes_after_latency_only() -> None:
    sim, net, fin = make_net()
    link = net.add_link("cnic_tx", 50 * GB, latency_s=1e-6)
    net.start_flow(0, [link], LOW, done_at, sim, fin, "a")
    sim.run()
    assert fin["a"] == pytest.approx(1e-6)


def test_two_equal_flows_share_equally_and_finish_together() -> None:
    sim, net, fin = make_net()
    link = net.add_link("l", 10 * GB)
    net.start_flow(10 * GB, [link], LOW, done_at, sim, fin, "a")
    net.start_flow(10 * GB, [link], LOW, done_at, sim, fin, "b")
    sim.run()
    assert fin["a"] == pytest.approx(2.0) and fin["b"] == pytest.approx(2.0)


def test_a_finishing_flow_frees_bandwidth_for_the_other() -> None:
    # a: 5 GB, b: 15 GB on 10 GB/s. Shared until a ends at 1.0 s (5 GB each); b's last 10 GB at full rate.
    sim, net, fin = make_net()
    link = net.add_link("l", 10 * GB)
    net.start_flow(5 * GB, [link], LOW, done_at, sim, fin, "a")
    net.start_flow(15 * GB, [link], LOW, done_at, sim, fin, "b")
    sim.run()
    assert fin["a"] == pytest.approx(1.0)
    assert fin["b"] == pytest.approx(2.0)


def test_a_late_flow_slows_the_first() -> None:
    # a alone for 1 s (10 GB of 20), then shares with b (10 GB): both have 10 GB left at 5 GB/s -> t=3.
    sim, net, fin = make_net()
    link = net.add_link("l", 10 * GB)
    net.start_flow(20 * GB, [link], LOW, done_at, sim, fin, "a")
    sim.schedule(1.0, lambda: net.start_flow(10 * GB, [link], LOW, done_at, sim, fin, "b"))
    sim.run()
    assert fin["a"] == pytest.approx(3.0) and fin["b"] == pytest.approx(3.0)


def test_high_class_gets_its_wrr_share_while_both_are_active() -> None:
    sim, net, fin = make_net(high_priority_share=0.99)
    link = net.add_link("cnic_tx", 100 * GB)
    high = net.start_flow(99 * GB, [link], HIGH, done_at, sim, fin, "high")
    low = net.start_flow(2 * GB, [link], LOW, done_at, sim, fin, "low")
    sim.run(until_s=0.5)
    assert high.rate_bytes_per_s / low.rate_bytes_per_s == pytest.approx(99.0)
    hb, lb = link.bytes_carried_by_class(sim.now_s)
    assert hb / lb == pytest.approx(99.0)
    sim.run()
    # High: 99 GB at 99 GB/s -> 1.0 s. Low: 1 GB by then, last 1 GB at 100 GB/s -> 1.01 s.
    assert fin["high"] == pytest.approx(1.0)
    assert fin["low"] == pytest.approx(1.01)


def test_a_class_alone_gets_the_whole_link() -> None:
    sim, net, fin = make_net()
    link = net.add_link("l", 10 * GB)
    flow = net.start_flow(10 * GB, [link], HIGH, done_at, sim, fin, "h")
    sim.run(until_s=0.1)
    assert flow.rate_bytes_per_s == pytest.approx(10 * GB)


def test_high_share_unused_elsewhere_goes_to_low() -> None:
    # High is bottlenecked at 2 GB/s on its own link, so low takes the remaining 8 GB/s of the shared link.
    sim, net, _ = make_net()
    shared = net.add_link("shared", 10 * GB)
    narrow = net.add_link("narrow", 2 * GB)
    high = net.start_flow(100 * GB, [narrow, shared], HIGH, lambda: None)
    low = net.start_flow(100 * GB, [shared], LOW, lambda: None)
    sim.run(until_s=0.1)
    assert high.rate_bytes_per_s == pytest.approx(2 * GB)
    assert low.rate_bytes_per_s == pytest.approx(8 * GB)


def test_multi_link_flow_is_limited_by_its_bottleneck_and_spare_goes_to_others() -> None:
    # Classic max-min: f1 crosses A (10) and B (4); f2 only A. f1 = 4 (bottleneck B), f2 = 6 (spare on A).
    sim, net, _ = make_net()
    a = net.add_link("A", 10 * GB)
    b = net.add_link("B", 4 * GB)
    f1 = net.start_flow(100 * GB, [a, b], LOW, lambda: None)
    f2 = net.start_flow(100 * GB, [a], LOW, lambda: None)
    sim.run(until_s=0.1)
    assert f1.rate_bytes_per_s == pytest.approx(4 * GB)
    assert f2.rate_bytes_per_s == pytest.approx(6 * GB)
    assert a.rate_bytes_per_s == pytest.approx(10 * GB)


def test_parking_lot_max_min() -> None:
    # Links L1, L2 of 1 GB/s; long flow crosses both, one short flow on each: all get 0.5.
    sim, net, _ = make_net()
    l1, l2 = net.add_link("L1", GB), net.add_link("L2", GB)
    flows = [
        net.start_flow(10 * GB, [l1, l2], LOW, lambda: None),
        net.start_flow(10 * GB, [l1], LOW, lambda: None),
        net.start_flow(10 * GB, [l2], LOW, lambda: None),
    ]
    sim.run(until_s=0.1)
    assert [f.rate_bytes_per_s for f in flows] == pytest.approx([0.5 * GB] * 3)


def test_half_duplex_dram_is_shared_by_reads_and_writes() -> None:
    # SNIC rx -> DRAM (write) and DRAM -> CNIC tx (read) cross one DRAM link of 60 GB/s: 30 each.
    sim, net, _ = make_net()
    snic_rx = net.add_link("snic_rx", 50 * GB)
    dram = net.add_link("dram", 60 * GB)
    cnic_tx = net.add_link("cnic_tx", 50 * GB)
    w = net.start_flow(100 * GB, [snic_rx, dram], LOW, lambda: None)
    r = net.start_flow(100 * GB, [dram, cnic_tx], LOW, lambda: None)
    sim.run(until_s=0.1)
    assert w.rate_bytes_per_s == pytest.approx(30 * GB)
    assert r.rate_bytes_per_s == pytest.approx(30 * GB)


def test_abort_frees_bandwidth_and_skips_callback() -> None:
    sim, net, fin = make_net()
    link = net.add_link("l", 10 * GB)
    a = net.start_flow(10 * GB, [link], LOW, done_at, sim, fin, "a")
    net.start_flow(10 * GB, [link], LOW, done_at, sim, fin, "b")
    sim.schedule(1.0, net.abort_flow, a)  # b has 5 GB left, alone at 10 GB/s -> 1.5 s
    sim.run()
    assert "a" not in fin
    assert fin["b"] == pytest.approx(1.5)


def _alone(start_s: float, size_bytes: float, caps: tuple[float, float]) -> float:
    """Finish time of one flow on a new network of two links, started at `start_s`."""
    sim, net, fin = make_net()
    path = [net.add_link("l1", caps[0]), net.add_link("l2", caps[1])]
    sim.schedule_at(start_s, lambda: net.start_flow(size_bytes, path, LOW, done_at, sim, fin, "b"))
    sim.run()
    return fin["b"]


def test_a_path_whose_flows_ended_starts_afresh_later() -> None:
    # The network drops an emptied path's group; the path's next flow makes a new one and must finish
    # at exactly the time a new network gives it.
    caps = (7.3 * GB, 11.9 * GB)
    sim, net, fin = make_net()
    path = [net.add_link("l1", caps[0]), net.add_link("l2", caps[1])]
    net.start_flow(3.3 * GB + 0.37, path, LOW, done_at, sim, fin, "a")
    c = net.start_flow(2.2 * GB, path, LOW, done_at, sim, fin, "c")
    sim.schedule(0.1, net.abort_flow, c)  # its heap entry is left behind (lazy deletion)
    sim.schedule_at(5.0, lambda: net.start_flow(7.7 * GB + 0.123, path, LOW, done_at, sim, fin, "b"))
    sim.run()
    assert fin["a"] < 5.0 and "c" not in fin
    assert fin["b"] == _alone(5.0, 7.7 * GB + 0.123, caps)
    assert not path[0].groups and path[0].num_flows == 0 and path[0].rate_bytes_per_s == 0.0  # off its links


def test_the_network_holds_only_groups_with_flows() -> None:
    # An emptied group leaves the network (a large cluster has tens of thousands of paths, a few
    # hundred active at a time); the path's next flow gets a group of its own, in the state a new one
    # has: the last group emptied, renewed (`FlowGroup.renew`), its heap's slots holding no flow that left.
    sim, net, _ = make_net()
    path = (net.add_link("l1", GB), net.add_link("l2", GB))
    other = (net.add_link("l3", GB),)
    a = net.start_flow(GB, path, LOW, lambda: None)
    b = net.start_flow(GB, other, HIGH, lambda: None)
    assert net.num_groups == 2
    sim.run(until_s=0.5)
    net.abort_flow(a)
    assert net.num_groups == 1 and a._group is not None and a._group.num_flows == 0
    sim.run()
    assert b.done and net.num_groups == 0
    assert a._group is not None and b._group is not None
    assert a not in a._group.heap and b not in b._group.heap  # no flow names its group both ways
    c = net.start_flow(GB, path, LOW, lambda: None)
    assert c._group is b._group  # b's group emptied last (other path, other class): renewed
    assert a._group is not None and a not in a._group.heap
    new = FlowGroup(path, False, sim.now_s)
    fields = [n for n in dir(new) if not n.startswith("__") and not callable(getattr(new, n))]
    assert len(fields) >= 13  # the slots (a compiled class has no `__slots__` to read)
    for name in fields:
        if name not in ("num_flows", "heap", "num_queued", "dirty", "path"):  # the join's own changes
            assert getattr(c._group, name) == getattr(new, name), name
    assert c._group.num_flows == 1 and c._group.queued() == [c] and c._group.path == path


def test_a_path_emptied_and_joined_in_one_instant_starts_afresh() -> None:
    caps = (7.3 * GB, 11.9 * GB)
    sim, net, fin = make_net()
    path = [net.add_link("l1", caps[0]), net.add_link("l2", caps[1])]

    def then_b() -> None:  # a's completion starts b on the same path, as the driver's chains do
        fin["a"] = sim.now_s
        net.start_flow(7.7 * GB + 0.123, path, LOW, done_at, sim, fin, "b")

    net.start_flow(3.3 * GB + 0.37, path, LOW, then_b)
    sim.run()
    assert fin["b"] == _alone(fin["a"], 7.7 * GB + 0.123, caps)


def test_the_rate_updates_scratch_lists_hold_no_group_between_updates() -> None:
    # `links_fill.free_slots`: between updates, the slots of the network's fill list, dirty list,
    # violation candidates, re-filled and frozen groups hold the placeholder, not groups of past updates
    # (releasing a long-gone group at the slot's next use was a cache miss on a large cluster).
    # Parking lot: fills of several groups.
    sim, net, fin = make_net()
    a, b = net.add_link("a", 10 * GB), net.add_link("b", 6 * GB)
    net.start_flow(9 * GB, [a, b], LOW, done_at, sim, fin, "ab")
    net.start_flow(7 * GB, [a], LOW, done_at, sim, fin, "a")
    sim.schedule(0.3, lambda: net.start_flow(5 * GB, [b], LOW, done_at, sim, fin, "b"))
    sim.run(until_s=0.5)
    assert len(net._fill_members) >= 4  # noqa: SLF001 (groups ab and a on link a, ab and b on link b)
    assert all(g is FREE_SLOT for g in net._fill_members)  # noqa: SLF001
    assert all(link.fill_len == 0 for link in (a, b))
    assert net._dirty_groups and all(g is FREE_SLOT for g in net._dirty_groups)  # noqa: SLF001
    assert net._vio_groups and all(g is FREE_SLOT for g in net._vio_groups)  # noqa: SLF001 (find_violations)
    assert len(net._refilled) >= 2 and all(g is FREE_SLOT for g in net._refilled)  # noqa: SLF001
    assert len(net._frozen) >= 2 and all(g is FREE_SLOT for g in net._frozen)  # noqa: SLF001
    assert all(not link.vio_new and link.vio_top == -1.0 for link in (a, b))
    sim.run()
    assert set(fin) == {"ab", "a", "b"}
    assert all(g is FREE_SLOT for g in net._fill_members)  # noqa: SLF001
    assert all(g is FREE_SLOT for g in net._vio_groups)  # noqa: SLF001
    assert all(g is FREE_SLOT for g in (*net._refilled, *net._frozen))  # noqa: SLF001


def test_utilisation_record_and_resampling() -> None:
    sim, net, _ = make_net()
    link = net.add_link("l", 10 * GB, record=True)
    net.start_flow(10 * GB, [link], LOW, lambda: None)  # 0..1 s at 10 GB/s
    sim.schedule(2.0, lambda: net.start_flow(5 * GB, [link], LOW, lambda: None))  # 2..2.5 s
    sim.run()
    assert link.utilisation_record() == [(0.0, 10 * GB), (1.0, 0.0), (2.0, 10 * GB), (2.5, 0.0)]
    bins = resample_utilisation(link.utilisation_record(), 0.0, 3.0, 1.0)
    assert [t for t, _ in bins] == [0.0, 1.0, 2.0]
    assert [r for _, r in bins] == pytest.approx([10 * GB, 0.0, 5 * GB])


def test_capped_component_stays_feasible() -> None:
    # With a tiny cap, rates are approximate but never exceed any link's capacity.
    sim, net, _ = make_net(max_component_flows=1)
    links = [net.add_link(f"l{i}", GB) for i in range(4)]
    for i in range(12):
        net.start_flow(GB * (1 + i % 3), [links[i % 4], links[(i + 1) % 4]], LOW, lambda: None)
    for _ in range(40):
        sim.run(max_events=3)
        for link in links:
            assert link.rate_bytes_per_s <= link.capacity_bytes_per_s * (1 + 1e-9)
    sim.run()
    assert net.flows_completed == 12


def random_workload(net: LinkNetwork, sim: Simulator, log: list[tuple[float, int]]) -> None:
    links = [net.add_link(f"l{i}", (1 + i % 3) * GB) for i in range(6)]

    def done(i: int) -> None:
        log.append((sim.now_s, i))

    for i in range(60):
        path = [links[(i * 5) % 6], links[(i * 7 + 1) % 6]] if i % 4 else [links[i % 6]]
        cls = HIGH if i % 5 == 0 else LOW
        sim.schedule(i * 0.013, net.start_flow, (i % 7 + 1) * 0.1 * GB, path, cls, done, i)


def test_same_inputs_give_identical_completion_order_and_times() -> None:
    runs = []
    for _ in range(2):
        sim, net, _ = make_net()
        log: list[tuple[float, int]] = []
        random_workload(net, sim, log)
        sim.run()
        runs.append(log)
    assert runs[0] == runs[1]
    assert len(runs[0]) == 60


def test_conservation_bytes_carried_equal_bytes_sent() -> None:
    sim, net, _ = make_net()
    log: list[tuple[float, int]] = []
    random_workload(net, sim, log)
    sim.run()
    total_sent = sum((i % 7 + 1) * 0.1 * GB * (2 if i % 4 else 1) for i in range(60))
    carried = sum(link.bytes_carried(sim.now_s) for link in net.links.values())
    assert carried == pytest.approx(total_sent, rel=1e-9)


def test_capped_component_includes_links_of_boundary_flows() -> None:
    # A chain l0-l1-...-l7 with flows over neighbouring pairs: the cap cuts the component mid-chain.
    sim, net, _ = make_net(max_component_flows=2)
    chain = [net.add_link(f"c{i}", GB) for i in range(8)]
    for i in range(7):
        for _ in range(3):
            net.start_flow(0.5 * GB, [chain[i], chain[i + 1]], LOW, lambda: None)
    sim.run()
    assert net.flows_completed == 21
    for link in chain:
        assert link.bytes_carried(sim.now_s) == pytest.approx(
            (3 if link in (chain[0], chain[7]) else 6) * 0.5 * GB
        )


@pytest.mark.parametrize("seed", range(20))
def test_fill_heap_path_makes_the_same_choices_as_the_scan(seed: int) -> None:
    import random

    from dualpath.sim.links import Link
    from dualpath.sim.links_fill import FlowGroup, fill

    rng = random.Random(seed)
    links = [
        Link(f"l{i}", rng.choice([1.0, 2.0, 5.0]) * rng.uniform(0.5, 1.5)) for i in range(rng.randint(40, 90))
    ]
    groups: dict[FlowGroup, None] = {}
    for _ in range(rng.randint(50, 200)):
        g = FlowGroup(tuple(rng.sample(links, rng.randint(1, 4))), False, 0.0)
        g.num_flows = rng.randint(1, 5)
        groups[g] = None
    residual = {link: link.capacity_bytes_per_s * rng.choice([1.0, 1.0, 0.5, 0.0]) for link in links}

    def run(threshold: int) -> tuple[list[tuple[FlowGroup, float]], dict[FlowGroup, Link]]:
        frozen_at: dict[FlowGroup, Link] = {}
        frozen = fill(list(groups), dict(residual), [], frozen_at, heap_above_links=threshold)
        return [(g, g.fill_rate) for g in frozen], frozen_at

    scan, heap = run(10**9), run(0)
    assert scan == heap  # the same order of freezes, rates (exactly) and bottleneck links


def test_a_flow_finds_its_paths_group_on_the_links_and_groups_leave_in_order() -> None:
    # A path's group is found among the groups of its links (no dict by path): an equal path given as
    # another tuple or a list joins the same group; another class, a sub-path or a longer path do not.
    # A group leaving a link keeps the others in joining order, and the slots it used hold the placeholder.
    sim, net, _ = make_net()
    a, b, c = net.add_link("a", GB), net.add_link("b", GB), net.add_link("c", GB)
    f1 = net.start_flow(GB, (a, b), LOW, lambda: None)
    f2 = net.start_flow(GB, [a, b], LOW, lambda: None)  # equal path, another object
    f3 = net.start_flow(GB, (a, b), HIGH, lambda: None)
    f4 = net.start_flow(GB, (a,), LOW, lambda: None)
    f5 = net.start_flow(GB, (a, b, c), LOW, lambda: None)
    f6 = net.start_flow(GB, (b, a), LOW, lambda: None)
    assert f1._group is f2._group and f1._group.num_flows == 2
    groups = [f._group for f in (f1, f3, f4, f5, f6)]
    assert len({id(g) for g in groups}) == 5 and net.num_groups == 5
    assert a.groups == groups and b.groups == [groups[0], groups[1], groups[3], groups[4]]
    net.abort_flow(f3)
    net.abort_flow(f4)
    assert a.groups == [groups[0], groups[3], groups[4]] and net.num_groups == 3
    assert a.num_groups == 3 and all(g is FREE_SLOT for g in a.group_slots[3:])
    f7 = net.start_flow(GB, (a,), LOW, lambda: None)  # joins at the end, in a kept slot
    assert a.groups == [groups[0], groups[3], groups[4], f7._group] and len(a.group_slots) == 5
    sim.run()
    assert net.num_groups == 0 and a.num_groups == 0 and all(g is FREE_SLOT for g in a.group_slots)
