"""Water-filling for the fluid link network, on flow groups instead of single flows.

NOTE: flows with the same path and traffic class always get the same max-min rate, so the network keeps
one `FlowGroup` per (class, path) with a count of its flows (`num_flows`) and one per-flow `rate`. A
group's flows share a processor-sharing virtual clock (`vtime_bytes`: bytes each of its flows has
received), so a flow's finish tag is `vtime_bytes at its start + size_bytes`, and the whole group needs
one kernel event: its smallest tag. A rate change costs O(1) per group, not O(flows).

Max-min fairness (Bertsekas & Gallager, Data Networks §6.5.2): an allocation is max-min fair iff it is
feasible and every flow has a *bottleneck* link — saturated, and no flow on it has a higher rate.
`fill` is progressive filling (weighted by `num_flows`); `find_violations` checks the bottleneck
condition, which the incremental update uses to grow the set of groups it re-fills until the condition
holds everywhere (see `LinkNetwork._incremental`).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dualpath.sim.kernel import EventHandle
    from dualpath.sim.links import Flow, Link

# A link carrying at least (1 - this) of its capacity is saturated; a rate within this (relative) of the
# largest on a link is the largest. Looser than the network's 1e-9 rescheduling tolerance, so rates kept
# unchanged by that tolerance never look like violations.
SAT_RTOL = 1e-8


class FlowGroup:
    """The active flows of one (traffic class, path): equal rates, one virtual clock, one kernel event."""

    __slots__ = (
        "path",
        "high",
        "num_flows",
        "rate",
        "vtime_bytes",
        "last_s",
        "heap",
        "handle",
        "handle_tag",
        "bottleneck",
    )

    def __init__(self, path: tuple[Link, ...], high: bool, now_s: float) -> None:
        self.path = path
        self.high = high
        self.num_flows = 0
        self.rate = 0.0  # bytes/s of each flow
        self.vtime_bytes = 0.0  # bytes each flow of the group has received since the group was made
        self.last_s = now_s
        self.heap: list[tuple[float, int, Flow]] = []  # (finish tag, start seq, flow); aborted ones lazily
        self.handle: EventHandle | None = None
        self.handle_tag = -1.0  # finish tag the handle was scheduled for, at the current rate
        self.bottleneck: Link | None = None  # a link where it is saturated and fastest (single class)

    def settle(self, now_s: float) -> None:
        self.vtime_bytes += self.rate * (now_s - self.last_s)
        self.last_s = now_s

    def top(self) -> tuple[float, int, Any] | None:
        """The live entry with the smallest finish tag (drops aborted flows from the top)."""
        heap = self.heap
        while heap and not heap[0][2].active:
            heapq.heappop(heap)
        return heap[0] if heap else None


def fill(
    groups: dict[FlowGroup, None], residual: dict[Link, float], frozen_at: dict[FlowGroup, Link] | None = None
) -> dict[FlowGroup, float]:
    """Progressive filling: max-min fair per-flow rates for `groups` within `residual` bytes/s per link.

    Every link of every group must be a key of `residual` (which is modified). Repeatedly the link with
    the smallest fair share (residual / unfrozen flows) freezes its unfrozen groups at that share.
    `frozen_at`, if given, receives the link each group was frozen at.
    """
    if len(groups) == 1:  # the common case: one group, limited by its tightest link
        (g,) = groups
        path = g.path
        link = path[0]
        least = residual[link]
        for other in path:  # the first tightest link, as min() would pick
            free = residual[other]
            if free < least:
                link, least = other, free
        best = least / g.num_flows
        if frozen_at is not None:
            frozen_at[g] = link
        return {g: best if best > 0.0 else 0.0}
    count: dict[Link, int] = {}  # unfrozen flows on each link; a link leaves when it has none
    members: dict[Link, list[FlowGroup]] = {}  # the groups to fill on each link (not all its groups)
    for g in groups:
        n = g.num_flows
        for link in g.path:
            c = count.get(link)
            if c is None:
                count[link] = n
                members[link] = [g]
            else:
                count[link] = c + n
                members[link].append(g)
    if len(count) > _HEAP_FILL_LINKS:
        return _fill_with_heap(count, members, residual, frozen_at)
    rates: dict[FlowGroup, float] = {}  # also the set of frozen groups
    # Every group crosses a link of `count` until it is frozen (num_flows > 0), so this runs until all are.
    while count:
        # A linear scan: faster than a heap below _HEAP_FILL_LINKS links.
        bottleneck = None
        best = float("inf")
        for link, n in count.items():
            fair = residual[link] / n
            if fair < best:
                best, bottleneck = fair, link
        assert bottleneck is not None
        _freeze(bottleneck, best if best > 0.0 else 0.0, members, count, residual, rates, frozen_at, None)
    return rates


def _freeze(
    bottleneck: Link,
    best: float,
    members: dict[Link, list[FlowGroup]],
    count: dict[Link, int],
    residual: dict[Link, float],
    rates: dict[FlowGroup, float],
    frozen_at: dict[FlowGroup, Link] | None,
    touched: dict[Link, None] | None,
) -> None:
    """Freeze the bottleneck's unfrozen groups at `best`; their links lose their flows and share.
    `touched`, if given, receives the links still unfrozen whose share changed."""
    for g in members[bottleneck]:
        if g in rates:
            continue
        rates[g] = best
        if frozen_at is not None:
            frozen_at[g] = bottleneck
        n = g.num_flows
        used = n * best
        for link in g.path:
            residual[link] -= used
            left = count[link] - n
            if left:
                count[link] = left
                if touched is not None:
                    touched[link] = None
            else:
                del count[link]  # no unfrozen group left: never a bottleneck again
                if touched is not None:
                    touched.pop(link, None)


def _fill_with_heap(
    count: dict[Link, int],
    members: dict[Link, list[FlowGroup]],
    residual: dict[Link, float],
    frozen_at: dict[FlowGroup, Link] | None,
) -> dict[FlowGroup, float]:
    """`fill`'s loop for large sets (a cluster of tens of nodes re-fills 100+ groups over as many links):
    the same choices, the link with the smallest fair share first and the earlier link on a tie, from a
    heap of (fair share, link order) entries; an entry is stale once its link's share changed."""
    order = {link: i for i, link in enumerate(count)}
    heap = [(residual[link] / n, order[link], link) for link, n in count.items()]
    heapq.heapify(heap)
    rates: dict[FlowGroup, float] = {}
    while count:
        fair, _, bottleneck = heapq.heappop(heap)
        n_left = count.get(bottleneck)
        if n_left is None or residual[bottleneck] / n_left != fair:
            continue  # stale: the link left, or its share changed and a fresh entry was pushed
        touched: dict[Link, None] = {}
        _freeze(bottleneck, fair if fair > 0.0 else 0.0, members, count, residual, rates, frozen_at, touched)
        for link in touched:
            if link in count:
                heapq.heappush(heap, (residual[link] / count[link], order[link], link))
    return rates


# Above this many links in a re-filled set, `fill` keeps its candidates in a heap; below, the linear scan
# is faster. Measured with the native build (random sets of 2-3-link groups, 2026-11-30): scan / heap
# 28 / 51 µs at 32 links, 339 / 376 µs at 100, 986 / 865 µs at 200. 2P4D re-fills cross 5-100 links;
# clusters of tens of nodes cross hundreds.
_HEAP_FILL_LINKS = 150


def set_bottleneck(g: FlowGroup, link: Link | None) -> None:
    """Remember `link` as the group's bottleneck, in the link's index of groups bottlenecked there."""
    old = g.bottleneck
    if old is link:
        return
    if old is not None:
        del old.bottlenecked[g]
    if link is not None:
        link.bottlenecked[g] = None
    g.bottleneck = link


def _top_rate(link: Link, rates: dict[FlowGroup, float]) -> float:
    top = 0.0
    for g in link.groups:
        r = rates.get(g, g.rate)
        if r > top:
            top = r
    return top


def cached_top_rate(link: Link) -> float:
    """Largest per-flow rate of the link's groups, cached on the link (`LinkNetwork._apply` keeps it exact
    or marks it stale): equal to `_top_rate(link, {})`, without the scan while no rate there changed."""
    top = link.top_rate
    if top < 0.0:
        top = 0.0
        for g in link.groups:
            r = g.rate
            if r > top:
                top = r
        link.top_rate = top
    return top


def bottlenecked_on(link: Link, into: dict[FlowGroup, None] | None = None) -> dict[FlowGroup, None]:
    """Groups at the largest rate on `link` (its bottlenecked ones, if the link is saturated), added to
    `into` (a new dict when None), which is returned."""
    top = cached_top_rate(link) * (1.0 - SAT_RTOL)
    if into is None:
        into = {}
    for g in link.groups:
        if g.rate >= top:
            into[g] = None
    return into


def find_violations(
    refilled: dict[FlowGroup, None], rates: dict[FlowGroup, float], saturated_before: dict[Link, bool]
) -> dict[FlowGroup, None]:
    """Groups to add to `refilled` so that re-filling can restore the bottleneck condition (empty: none).

    Only groups whose condition can have changed are checked: the re-filled ones, and the others on a
    link the re-filled ones cross that was or is saturated (an unsaturated link is nobody's bottleneck,
    and links the re-filled groups do not cross keep their load and rates). A group remembers the link
    that last satisfied its condition (`bottleneck`); while that link is untouched, it still does.
    """
    tol = 1.0 - SAT_RTOL
    new_load: dict[Link, float] = {}  # links the re-filled groups cross: load with the new rates
    for g in refilled:
        change = g.num_flows * (rates[g] - g.rate)
        for link in g.path:
            load = new_load.get(link)
            new_load[link] = (link.rate_high + link.rate_low if load is None else load) + change
    candidates: dict[FlowGroup, None] = dict(refilled)
    saturated: dict[Link, bool] = {}
    for link, load in new_load.items():
        sat = saturated[link] = load >= link.capacity_bytes_per_s * tol
        if sat or saturated_before[link]:
            candidates.update(link.bottlenecked)
    top: dict[Link, float] = {}
    grow: dict[FlowGroup, None] = {}
    for g in candidates:
        r = rates.get(g, g.rate)
        found = None
        for link in g.path:
            known = saturated.get(link)
            if known is None:
                known = saturated[link] = link.rate_high + link.rate_low >= link.capacity_bytes_per_s * tol
            if not known:
                continue
            t = top.get(link)
            if t is None:
                # Only the re-filled groups have new rates, and they cross only the links of `new_load`.
                t = top[link] = _top_rate(link, rates) if link in new_load else cached_top_rate(link)
            if r >= t * tol:
                found = link
                break
        if found is not None:
            set_bottleneck(g, found)
            continue
        if g not in refilled:
            grow[g] = None
            continue
        # A re-filled group under a faster fixed one: the fixed ones must give way. Only those on its
        # saturated links and faster than it can (fill froze it at a saturated link, where a faster
        # group is fixed, or the condition would hold there); an unsaturated DRAM crossed by every path
        # of its node would otherwise pull in all of them. If none is found, all groups on its links.
        give_way: dict[FlowGroup, None] = {}
        for link in g.path:
            if not saturated[link]:
                continue
            for h in link.groups:
                if h not in refilled and rates.get(h, h.rate) * tol > r:
                    give_way[h] = None
        if not give_way:
            for link in g.path:
                for h in link.groups:
                    if h not in refilled:
                        give_way[h] = None
        grow.update(give_way)
    return grow


def fixed_residual(groups: dict[FlowGroup, None]) -> dict[Link, float]:
    """Capacity of each link the `groups` cross, less what the other groups on it use now.

    From the link's aggregate rate (kept equal to the sum over its groups) instead of a scan of its
    groups: a DRAM or storage link crossed by many groups costs O(1) here.
    """
    residual: dict[Link, float] = {}
    get = residual.get
    for g in groups:
        used = g.num_flows * g.rate
        for link in g.path:
            free = get(link)
            if free is None:
                free = link.capacity_bytes_per_s - link.rate_high - link.rate_low
            residual[link] = free + used
    for link, free in residual.items():
        if free < 0.0:
            residual[link] = 0.0
    return residual
