"""A flow group's heap of flows and a link's groups bottlenecked there, against the library code they
replace: `heapq` on `Flow.__lt__`, and a plain list's `append` and `remove`."""

from __future__ import annotations

import heapq
import random

import pytest

from dualpath.sim.kernel import Simulator
from dualpath.sim.links import Flow, Link, LinkNetwork, TrafficClass
from dualpath.sim.links_fill import FREE_SLOT, FlowGroup, flow_heap_pop, flow_heap_push, set_bottleneck


def _flow(tag: float, seq: int) -> Flow:
    flow = Flow(1.0, (), TrafficClass.LOW, lambda: None, ())
    flow._tag = tag  # noqa: SLF001 (the heap's keys)
    flow._seq = seq  # noqa: SLF001
    return flow


@pytest.mark.parametrize("seed", range(20))
def test_the_flow_heap_is_heapq_step_for_step(seed: int) -> None:
    # Same flows in the same places after every push and pop, the same flow popped: ties on the tag
    # (few distinct tags) are broken by the join order, as `Flow.__lt__` breaks them for `heapq`. The
    # group's list keeps its slots: only the first `num_queued` are the heap.
    rng = random.Random(seed)
    ours = FlowGroup((), False, 0.0)
    theirs: list[Flow] = []
    seq = peak = 0
    for _ in range(600):
        if ours.num_queued and rng.random() < 0.45:
            assert flow_heap_pop(ours) is heapq.heappop(theirs)
        else:
            seq += 1
            flow = _flow(float(rng.randrange(8)), seq)
            flow_heap_push(ours, flow)
            heapq.heappush(theirs, flow)
        peak = max(peak, len(theirs))
        assert [id(f) for f in ours.queued()] == [id(f) for f in theirs]
    while theirs:
        assert flow_heap_pop(ours) is heapq.heappop(theirs)
    assert ours.queued() == [] and ours.num_queued == 0
    assert len(ours.heap) == peak  # the slots stay for the next pushes


def test_a_group_finishes_its_flows_in_tag_order_then_join_order() -> None:
    sim = Simulator()
    net = LinkNetwork(sim)
    link = net.add_link("l", 1e9)
    done: list[str] = []
    for name, size in (("c", 3e9), ("a", 1e9), ("b", 1e9), ("d", 2e9)):
        net.start_flow(size, [link], TrafficClass.LOW, done.append, name)
    sim.run()
    assert done == ["a", "b", "d", "c"]


@pytest.mark.parametrize("seed", range(10))
def test_a_links_bottlenecked_groups_keep_a_lists_order(seed: int) -> None:
    # Groups take, change and drop their bottleneck at random; each link's first `num_bottlenecked`
    # slots equal the list that `append` and `remove` would keep, and every slot after them is free.
    rng = random.Random(seed)
    links = [Link(f"l{i}", 1e9) for i in range(3)]
    groups = [FlowGroup((), False, 0.0) for _ in range(8)]
    expected: dict[str, list[FlowGroup]] = {link.name: [] for link in links}
    for _ in range(500):
        g = rng.choice(groups)
        link = rng.choice([None, *links])
        if g.bottleneck is not link:
            if g.bottleneck is not None:
                expected[g.bottleneck.name].remove(g)
            if link is not None:
                expected[link.name].append(g)
        set_bottleneck(g, link)
        for each in links:
            assert each.bottlenecked == expected[each.name]
            assert all(s is FREE_SLOT for s in each.bottleneck_slots[each.num_bottlenecked :])
