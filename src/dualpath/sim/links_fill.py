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

import math
from typing import TYPE_CHECKING, Final, TypeVar

from mypy_extensions import i64

if TYPE_CHECKING:
    from dualpath.sim.kernel import EventHandle
    from dualpath.sim.links import Flow, Link

# A link carrying at least (1 - this) of its capacity is saturated; a rate within this (relative) of the
# largest on a link is the largest. Looser than the network's 1e-9 rescheduling tolerance, so rates kept
# unchanged by that tolerance never look like violations.
SAT_RTOL: Final = 1e-8
# Infinity as a compiled constant: `float("inf")` in a loop parses the string on every pass in the native build.
_INF: Final = math.inf


class FlowGroup:
    """The active flows of one (traffic class, path): equal rates, one virtual clock, one kernel event."""

    # NOTE: the native build lays the fields out in the order `__init__` first sets them. The fields
    # that the rate update's scans read for every group on a link (`find_violations`, `fill_into`,
    # `_top_rate`, `bottlenecked_on`) come first and the flags side by side, so that a scan reads one
    # or two cache lines of a group, not three; the rest is read only when the group itself changes.
    __slots__ = (
        "path",
        "rate",
        "fill_rate",
        "bottleneck",
        "num_flows",
        "high",
        "refill",
        "vio_seen",
        "fill_frozen",
        "dirty",
        "rate_moved",
        "vtime_bytes",
        "last_s",
        "heap",
        "num_queued",
        "handle",
        "handle_tag",
    )

    def __init__(self, path: tuple[Link, ...], high: bool, now_s: float) -> None:
        self.path = path
        self.rate = 0.0  # bytes/s of each flow
        self.fill_rate = 0.0  # the per-flow rate the last `fill` that included this group gave it
        self.bottleneck: Link | None = None  # a link where it is saturated and fastest (single class)
        self.num_flows = 0
        self.high = high
        # Set membership as flags, not dicts keyed by group (no hashing per test; False between updates):
        # in the update's re-filled set (`LinkNetwork._incremental`), already a candidate or grown in
        # `find_violations`.
        self.refill = False
        self.vio_seen = False
        self.fill_frozen = False  # scratch of `fill`: frozen in the fill running now (False between fills)
        self.dirty = False  # changed in this instant: its rate update is pending (`LinkNetwork._mark_dirty`)
        self.rate_moved = False  # its rate changed in `LinkNetwork._apply` (False between updates)
        self.vtime_bytes = 0.0  # bytes each flow of the group has received since the group was made
        self.last_s = now_s
        # Its flows by (finish tag, join order), `Flow.__lt__`, in the first `num_queued` slots of `heap`
        # (`flow_heap_push`); aborted ones leave lazily (`top`).
        self.heap: list[Flow] = []
        self.num_queued: i64 = 0
        self.handle: EventHandle | None = None
        self.handle_tag = -1.0  # finish tag the handle was scheduled for, at the current rate

    def renew(self, path: tuple[Link, ...], high: bool, now_s: float) -> None:
        """Become a new group of `path` and class `high`, as `__init__` makes one, keeping the heap's
        list and its slots (`LinkNetwork`'s spare groups: an emptied group, its heap's slots freed)."""
        self.path = path
        self.rate = 0.0
        self.fill_rate = 0.0
        self.bottleneck = None
        self.num_flows = 0
        self.high = high
        self.refill = False
        self.vio_seen = False
        self.fill_frozen = False
        self.dirty = False
        self.rate_moved = False
        self.vtime_bytes = 0.0
        self.last_s = now_s
        self.num_queued = 0
        self.handle = None
        self.handle_tag = -1.0

    def settle(self, now_s: float) -> None:
        self.vtime_bytes += self.rate * (now_s - self.last_s)
        self.last_s = now_s

    def top(self) -> Flow | None:
        """The live flow with the smallest finish tag (drops aborted flows from the top)."""
        heap = self.heap
        while self.num_queued and not heap[0].active:
            flow_heap_pop(self)
        return heap[0] if self.num_queued else None

    def queued(self) -> list[Flow]:
        """Its heap's flows, aborted ones not yet dropped included (a new list: inspection)."""
        return self.heap[: self.num_queued]


# NOTE: a group's flows are a binary min-heap in a list, ordered by `Flow.__lt__` (finish tag, then
# join order), kept by the two functions below: `heapq`'s algorithm step for step (its `heappush` and
# `heappop`, with `_siftdown` and `_siftup`), so the list holds the same flows in the same places. They
# compare the two unboxed fields directly; `heapq` called `Flow.__lt__` through the interpreter's
# generic comparison, several hundred instructions per push and pop (benchmarks/README.md). As the
# kernel's and a decode node's heaps, each typed on its own entries: a shared one would compare objects.
# The heap is the first `num_queued` slots of the group's list, which keeps its slots (`put_at`): most
# groups hold one flow, and a list popped to empty gave its storage back and took it again at the next
# push, a reallocation per flow. A slot past the count may still name a flow that left; it is
# overwritten by the next push, or the slots are cleared when the group's last flow leaves
# (`LinkNetwork._detach`: that flow names its group, so the group must not keep naming it).


def _flow_before(a: Flow, b: Flow) -> bool:
    """`a < b` (`Flow.__lt__`): the finish tag, then the join order (unique, so the order is total)."""
    if a._tag != b._tag:
        return a._tag < b._tag
    return a._seq < b._seq


def _flow_sift_up(heap: list[Flow], pos: i64) -> None:
    """The flow at `pos` up towards the root, moving the later parents down (`heapq._siftdown`, named
    for its direction here as the other heaps' `_sift_up`)."""
    flow = heap[pos]
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not _flow_before(flow, parent):
            break
        heap[pos] = parent
        pos = parent_pos
    heap[pos] = flow


def flow_heap_push(group: FlowGroup, flow: Flow) -> None:
    """`heapq.heappush(heap, flow)` on the group's heap."""
    end = group.num_queued
    put_at(group.heap, end, flow)
    group.num_queued = end + 1
    _flow_sift_up(group.heap, end)


def flow_heap_pop(group: FlowGroup) -> Flow:
    """`heapq.heappop(heap)` on the group's (non-empty) heap: the smallest flow out; the last one fills
    the root's place and sifts (the hole down to a leaf along the earlier child, then the flow back up:
    `heapq._siftup`)."""
    heap = group.heap
    end: i64 = group.num_queued - 1
    group.num_queued = end
    last = heap[end]
    if end == 0:
        return last
    smallest = heap[0]
    pos: i64 = 0
    child: i64 = 1
    while child < end:
        right = child + 1
        if right < end and not _flow_before(heap[child], heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    heap[pos] = last
    _flow_sift_up(heap, pos)
    return smallest


_Item = TypeVar("_Item")


def put_at(items: list[_Item], index: i64, item: _Item) -> None:
    """`items[index] = item` for a scratch list that keeps its slots between uses, its caller counting
    the live ones: the list grows by one when `index` is its length. (`list.clear()` would free the
    storage, and the next append allocate it again.) A list of groups gets its used slots freed by its
    caller (`free_slots`); links live as long as their network, so a slot may keep one."""
    if index < len(items):
        items[index] = item
    else:
        items.append(item)


# What a scratch list's slot holds between uses (`free_slots`): a placeholder, never a group of the network.
FREE_SLOT: Final = FlowGroup((), False, 0.0)


def add_group(link: Link, group: FlowGroup) -> None:
    """`group` joins `link`'s groups (`Link.group_slots`), after the others."""
    put_at(link.group_slots, link.num_groups, group)
    link.num_groups += 1


def remove_group(link: Link, group: FlowGroup) -> None:
    """`group` leaves `link`'s groups (`_remove_slot`)."""
    link.num_groups = _remove_slot(link.group_slots, link.num_groups, group)


def _remove_slot(slots: list[FlowGroup], count: i64, group: FlowGroup) -> i64:
    """`group` leaves the first `count` of `slots`; the later ones move up a slot, in order, and the last
    slot used gets `FREE_SLOT`. Returns the new count.

    NOTE: the slots stay. A list that removes its items (`list.remove`, `pop`) gives its storage back
    when it empties, and the next group to join allocates it again: a link of a 2P4D run empties and
    fills again with most flows, two reallocations per group per link (benchmarks/README.md).
    """
    last = count - 1
    i: i64 = 0
    while slots[i] is not group:  # groups compare by identity, as `list.remove` would find it
        i += 1
    while i < last:
        slots[i] = slots[i + 1]
        i += 1
    slots[last] = FREE_SLOT
    return last


def free_slots(items: list[FlowGroup], count: i64) -> None:
    """Put `FREE_SLOT` in the first `count` slots, at the end of their use.

    NOTE: writing a slot releases what it held. Freed at the end of their use, while those groups are
    in cache, the slots release only the placeholder at their next use; left as they were, the next use
    released a group of an update long past, on a large cluster far from any cache: each such write was
    a cache miss (at 48P96D half of `fill`'s own time, benchmarks/README.md).
    """
    for i in range(count):
        items[i] = FREE_SLOT


def fill(
    groups: list[FlowGroup],
    residual: dict[Link, float] | None,
    members: list[FlowGroup],
    frozen_at: dict[FlowGroup, Link] | None = None,
    *,
    heap_above_links: i64 = -1,
) -> list[FlowGroup]:
    """Progressive filling: max-min fair per-flow rates for `groups` within `residual` bytes/s per link.

    Returns the groups in the order they froze, each with its rate in `fill_rate` (a field, not a dict
    of rates: no float object and no hashing per group). `fill_into` with lists of its own.
    """
    frozen: list[FlowGroup] = []  # `fill_into` appends to an empty list (`put_at`)
    fill_into(groups, len(groups), residual, members, [], frozen, frozen_at, heap_above_links)
    return frozen


def fill_into(
    groups: list[FlowGroup],
    num_groups: i64,
    residual: dict[Link, float] | None,
    members: list[FlowGroup],
    links: list[Link],
    frozen: list[FlowGroup],
    frozen_at: dict[FlowGroup, Link] | None,
    heap_above_links: i64,
) -> i64:
    """`fill` of the first `num_groups` of `groups` into the first slots of `frozen`, in the order they
    froze, each with its rate in `fill_rate`; returns how many froze (all of them: each has flows).

    Every link of every group must be a key of `residual` (read, not modified). None: each link's
    capacity less what the groups not in `groups` use now, taken from the link's aggregate rate (kept
    equal to the sum over its groups) plus the groups' own use, instead of a scan of its groups (a
    DRAM link crossed by many groups costs O(1)); negative leftovers (float residue) count as 0.
    Repeatedly the link with the smallest fair share (residual / unfrozen flows) freezes its unfrozen
    groups at that share.
    `members`, `links` and `frozen` are the caller's scratch lists (its network's, kept between fills,
    `put_at`): each link's groups to fill, one run of slots per link; the links to fill; the groups as
    they freeze (the caller gives their slots `FREE_SLOT` once it has read them: `free_slots`).
    `frozen_at`, if given, receives the link each group was frozen at. `heap_above_links` (tests and
    benchmarks; < 0: `_HEAP_FILL_LINKS`): above this many links the loop keeps its candidates in a
    heap, else it scans them.
    """
    if num_groups == 1:  # the common case: one group, limited by its tightest link
        g = groups[0]
        path = g.path
        used = g.num_flows * g.rate
        link = path[0]
        least = _free(link, used) if residual is None else residual[link]
        for other in path:  # the first tightest link, as min() would pick
            free = _free(other, used) if residual is None else residual[other]
            if free < least:
                link, least = other, free
        best = least / g.num_flows
        if frozen_at is not None:
            frozen_at[g] = link
        g.fill_rate = best if best > 0.0 else 0.0
        put_at(frozen, 0, g)
        return 1
    # NOTE: the fill's per-link state (unfrozen flows, residual, groups to fill) lives in scratch fields
    # of the links themselves (`Link.fill_*`), not in dicts keyed by link: the fill is most of a rate
    # update, and a field is read without hashing. A link's groups to fill are the `fill_len` slots of
    # `members` from `fill_start`, in the order of `groups`: one list for all links, kept by the network
    # and warm, where a list per link was two more objects per link to miss in on a large cluster
    # (benchmarks/README.md). Between fills every `fill_count` is 0 (a link leaves the fill when its last
    # unfrozen group freezes) and every `fill_len` is 0. The lists of a fill (its links, its groups as
    # they freeze) are kept slots too: a list made per fill and grown from empty was a third of the
    # rate update's allocations (benchmarks/README.md).
    num_links: i64 = 0  # the links to fill, first seen first: the scan's tie-break order
    for i in range(num_groups):
        g = groups[i]
        n = g.num_flows
        used = n * g.rate
        for link in g.path:
            c = link.fill_count
            if c == 0:
                link.fill_count = n
                if residual is None:
                    link.fill_residual = link.capacity_bytes_per_s - link.rate_high - link.rate_low + used
                else:
                    link.fill_residual = residual[link]
                put_at(links, num_links, link)
                num_links += 1
            else:
                link.fill_count = c + n
                if residual is None:
                    link.fill_residual += used
            link.fill_len += 1
    slots: i64 = 0  # each link's run of `members`, then its groups into it
    for k in range(num_links):
        link = links[k]
        link.fill_start = slots
        slots += link.fill_len
        link.fill_len = 0
    while len(members) < slots:
        members.append(FREE_SLOT)
    for i in range(num_groups):
        g = groups[i]
        for link in g.path:
            members[link.fill_start + link.fill_len] = g
            link.fill_len += 1
    if residual is None:
        for k in range(num_links):
            link = links[k]
            if link.fill_residual < 0.0:
                link.fill_residual = 0.0
    if num_links > (heap_above_links if heap_above_links >= 0 else _HEAP_FILL_LINKS):
        num_frozen = _fill_with_heap(links[:num_links], members, frozen, frozen_at)
    else:
        num_frozen = _fill_by_scan(links, num_links, members, frozen, frozen_at, num_groups)
    for k in range(num_links):
        links[k].fill_len = 0
    free_slots(members, slots)
    for i in range(num_frozen):
        frozen[i].fill_frozen = False
    return num_frozen


def _fill_by_scan(
    links: list[Link],
    num_links: i64,
    members: list[FlowGroup],
    frozen: list[FlowGroup],
    frozen_at: dict[FlowGroup, Link] | None,
    num_groups: i64,
) -> i64:
    """`fill`'s loop for small sets: each round scans the first `num_links` of `links` for the smallest
    fair share among those with unfrozen flows (the earlier link on a tie) and freezes there. Every group
    crosses such a link until it is frozen (num_flows > 0), so this runs until all `num_groups` are; the
    round after the last freeze, which would find every link without unfrozen flows, is not scanned.
    Returns how many froze (into `frozen`)."""
    num_frozen: i64 = 0
    while num_frozen < num_groups:
        bottleneck = None
        best = _INF
        for k in range(num_links):
            link = links[k]
            n = link.fill_count
            if n:
                fair = link.fill_residual / n
                if fair < best:
                    best, bottleneck = fair, link
        if bottleneck is None:
            return num_frozen
        num_frozen = _freeze(
            bottleneck, best if best > 0.0 else 0.0, members, frozen, num_frozen, frozen_at, None
        )
    return num_frozen


def _freeze(
    bottleneck: Link,
    best: float,
    members: list[FlowGroup],
    frozen: list[FlowGroup],
    num_frozen: i64,
    frozen_at: dict[FlowGroup, Link] | None,
    touched: list[Link] | None,
) -> i64:
    """Freeze the bottleneck's unfrozen groups at `best` (into `frozen` from slot `num_frozen` on; returns
    the new count); their links lose their flows and share. `touched`, if given, receives each link whose
    share changed once (`fill_touched` set; the caller resets it), those left without unfrozen flows too."""
    start = bottleneck.fill_start
    for i in range(start, start + bottleneck.fill_len):
        g = members[i]
        if g.fill_frozen:
            continue
        g.fill_frozen = True
        g.fill_rate = best
        put_at(frozen, num_frozen, g)
        num_frozen += 1
        if frozen_at is not None:
            frozen_at[g] = bottleneck
        n = g.num_flows
        used = n * best
        for link in g.path:
            link.fill_residual -= used
            left = link.fill_count - n
            link.fill_count = left  # 0: no unfrozen group left, never a bottleneck again
            if touched is not None and not link.fill_touched:
                link.fill_touched = True
                touched.append(link)
    return num_frozen


def _fill_with_heap(
    heap: list[Link],
    members: list[FlowGroup],
    frozen: list[FlowGroup],
    frozen_at: dict[FlowGroup, Link] | None,
) -> i64:
    """`fill`'s loop for large sets (a cluster of tens of nodes re-fills 100+ groups over as many links):
    the same choices, the link with the smallest fair share first and the earlier link on a tie.
    `heap` is a new list of the links, in the fill's order. Returns how many froze (into `frozen`).

    NOTE: the heap holds the links themselves, keyed (`fill_share`, `fill_order`), each at its place
    (`fill_pos`; -1 once out). A freeze changes the shares of the links its groups cross: each moves
    in place, and a link left without unfrozen flows leaves. So the heap holds only live links and a
    freeze makes no object, where entries pushed anew at each change (the stale ones skipped when
    popped) would be made, sifted in and popped at every freeze of a large fill.
    """
    for i in range(len(heap)):
        link = heap[i]
        link.fill_order = i
        link.fill_pos = i
        link.fill_share = link.fill_residual / link.fill_count
    for pos in range(len(heap) // 2 - 1, -1, -1):  # heapify: each parent down into its subtree
        _link_sink(heap, pos, heap[pos])
    num_frozen: i64 = 0
    touched: list[Link] = []  # of one freeze
    while heap:
        bottleneck = heap[0]
        _link_remove(heap, bottleneck)
        fair = bottleneck.fill_share
        num_frozen = _freeze(
            bottleneck, fair if fair > 0.0 else 0.0, members, frozen, num_frozen, frozen_at, touched
        )
        for link in touched:
            link.fill_touched = False
            if link.fill_pos < 0:
                continue  # the bottleneck, out already
            if link.fill_count:
                link.fill_share = link.fill_residual / link.fill_count
                _link_resift(heap, link)
            else:
                _link_remove(heap, link)
        touched.clear()
    return num_frozen


def _link_before(a: Link, b: Link) -> bool:
    """`(a.fill_share, a.fill_order) < (b.fill_share, b.fill_order)`: the heap's order (a total one,
    each link's place in the fill's order being its own)."""
    if a.fill_share != b.fill_share:
        return a.fill_share < b.fill_share
    return a.fill_order < b.fill_order


def _link_sift_up(heap: list[Link], pos: i64, link: Link, top: i64) -> None:
    """Put `link` at `pos` or above it, no higher than `top`, moving the later parents down."""
    while pos > top:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not _link_before(link, parent):
            break
        heap[pos] = parent
        parent.fill_pos = pos
        pos = parent_pos
    heap[pos] = link
    link.fill_pos = pos


def _link_resift(heap: list[Link], link: Link) -> None:
    """`link`'s key changed: up or down from its place."""
    pos = link.fill_pos
    if pos > 0 and _link_before(link, heap[(pos - 1) >> 1]):
        _link_sift_up(heap, pos, link, 0)
    else:
        _link_sink(heap, pos, link)


def _link_sink(heap: list[Link], pos: i64, link: Link) -> None:
    """Put `link` at `pos` or below it, moving it down past its earlier child while that child is
    earlier, and no further. A freeze raises the shares of the links its groups cross, mostly by little
    (the bottleneck's share was the smallest), so a raised link stops a level or two down; `heapq`'s
    sift (the hole to a leaf, then the entry back up from there) went to a leaf every time."""
    end: i64 = len(heap)
    child = 2 * pos + 1
    while child < end:
        right = child + 1
        if right < end and _link_before(heap[right], heap[child]):
            child = right
        moved = heap[child]
        if not _link_before(moved, link):
            break
        heap[pos] = moved
        moved.fill_pos = pos
        pos = child
        child = 2 * pos + 1
    heap[pos] = link
    link.fill_pos = pos


def _link_remove(heap: list[Link], link: Link) -> None:
    """Take `link` out of the heap: the last link fills its place and sifts from there."""
    pos = link.fill_pos
    link.fill_pos = -1
    last = heap.pop()
    if last is not link:
        heap[pos] = last
        last.fill_pos = pos
        _link_resift(heap, last)


# Above this many links in a re-filled set, `fill` keeps its candidates in a heap; below, the linear scan
# is faster. Measured with the native build (30 random sets of 0.7 groups per link, each group on 2-3
# links; best of 5; 2026-12-05): scan / heap 0.8 / 2.2 µs at 16 links, 9.4 / 10.5 at 64, 19.2 / 18.6
# at 100, 38.1 / 30.5 at 150. 2P4D re-fills cross 5-100 links; clusters of tens of nodes cross hundreds.
_HEAP_FILL_LINKS: Final = 100


def set_bottleneck(g: FlowGroup, link: Link | None) -> None:
    """Remember `link` as the group's bottleneck, in the link's index of groups bottlenecked there
    (`Link.bottleneck_slots`)."""
    old = g.bottleneck
    if old is link:
        return
    if old is not None:
        old.num_bottlenecked = _remove_slot(old.bottleneck_slots, old.num_bottlenecked, g)
    if link is not None:
        put_at(link.bottleneck_slots, link.num_bottlenecked, g)
        link.num_bottlenecked += 1
    g.bottleneck = link


def _top_rate(link: Link) -> float:
    """Largest per-flow rate on `link` with the re-filled groups (`refill`) at their new rates (`fill_rate`)."""
    top = 0.0
    slots = link.group_slots
    for i in range(link.num_groups):
        g = slots[i]
        r = g.fill_rate if g.refill else g.rate
        if r > top:
            top = r
    return top


def cached_top_rate(link: Link) -> float:
    """Largest per-flow rate of the link's groups, cached on the link (`LinkNetwork._apply` keeps it exact
    or marks it stale): equal to `_top_rate(link, {})`, without the scan while no rate there changed."""
    top = link.top_rate
    if top < 0.0:
        top = 0.0
        slots = link.group_slots
        for i in range(link.num_groups):
            r = slots[i].rate
            if r > top:
                top = r
        link.top_rate = top
    return top


def bottlenecked_on(link: Link, into: list[FlowGroup], count: i64) -> i64:
    """Put into the slots of `into` from `count` on (`put_at`) the groups at the largest rate on `link`
    (its bottlenecked ones, if the link is saturated) that are not re-filled yet, marking them re-filled
    (`refill`); returns the new count."""
    top = cached_top_rate(link) * (1.0 - SAT_RTOL)
    slots = link.group_slots
    for i in range(link.num_groups):
        g = slots[i]
        if g.rate >= top and not g.refill:
            g.refill = True
            put_at(into, count, g)
            count += 1
    return count


def was_saturated(link: Link, update: i64) -> bool:
    """Whether `link` was saturated before this instant's changes: recorded when a group crossing it first
    changed (`LinkNetwork._mark_dirty`), else its load now (a link no changed group crosses has not
    changed yet), remembered in `link.sat_before` for the rest of rate update number `update`.

    NOTE: the record is stamped with the update's number (`link.sat_update`) rather than reset when the
    update ends: a record of an earlier update is simply stale, so no list of the links to reset is kept.
    """
    if link.sat_update == update:
        return link.sat_before
    saturated = link.rate_high + link.rate_low >= link.capacity_bytes_per_s * (1.0 - SAT_RTOL)
    link.sat_before = saturated
    link.sat_update = update
    return saturated


def find_violations(
    refilled: list[FlowGroup], num_refilled: i64, update: i64, links: list[Link], candidates: list[FlowGroup]
) -> i64:
    """Groups to add to the re-filled ones, the first `num_refilled` of `refilled`, so that re-filling can
    restore the bottleneck condition: put into the slots after them (`put_at`) in the order found; returns
    the new count (`num_refilled`: none). The re-filled groups (`refill` set) have their new rates in
    `fill_rate` (`fill` over them); the added ones are not marked (`refill`: the caller's).

    Only groups whose condition can have changed are checked: the re-filled ones, and the others on a
    link the re-filled ones cross that was or is saturated (an unsaturated link is nobody's bottleneck,
    and links the re-filled groups do not cross keep their load and rates). A group remembers the link
    that last satisfied its condition (`bottleneck`); while that link is untouched, it still does.
    Saturation before the change is `was_saturated` (`update`: the rate update's number).

    NOTE: per-link state (new load, saturated, largest rate) lives in the links' `vio_*` scratch
    fields, as `fill`'s does, and is reset before returning. The candidates and the groups to add are
    lists kept free of repeats by the groups' `vio_seen` flag (in first-seen order, as dicts would keep
    them), also reset before returning. `links` and `candidates` are the caller's scratch lists (its
    network's, kept between updates, as `fill`'s `members`): the first slots of each are this call's,
    counted here, so no list is made and grown from empty per update; the candidates' slots get
    `FREE_SLOT` again before returning (`free_slots`).
    """
    tol = 1.0 - SAT_RTOL
    num_links: i64 = 0  # `links`: those the re-filled groups cross (`vio_load`: load with the new rates)
    for i in range(num_refilled):
        g = refilled[i]
        change = g.num_flows * (g.fill_rate - g.rate)
        for link in g.path:
            if link.vio_new:
                link.vio_load += change
            else:
                link.vio_new = True
                link.vio_load = link.rate_high + link.rate_low + change
                put_at(links, num_links, link)
                num_links += 1
    num_candidates: i64 = 0  # the re-filled groups, then those bottlenecked on their links, each once
    for i in range(num_refilled):
        put_at(candidates, num_candidates, refilled[i])
        num_candidates += 1
    num_crossed = num_links
    for k in range(num_crossed):
        link = links[k]
        sat = link.vio_load >= link.capacity_bytes_per_s * tol
        link.vio_sat = _SAT if sat else _UNSAT
        if sat or was_saturated(link, update):
            bottlenecked = link.bottleneck_slots
            for j in range(link.num_bottlenecked):
                h = bottlenecked[j]
                if not h.refill and not h.vio_seen:
                    h.vio_seen = True
                    put_at(candidates, num_candidates, h)
                    num_candidates += 1
    for c in range(num_refilled, num_candidates):
        candidates[c].vio_seen = False
    # From here on `links` also collects the other links whose scratch fields get set (`vio_new`
    # False), so that one loop resets them all.
    num_grown = num_refilled  # the groups to add, each once (`vio_seen`), after the re-filled ones
    for c in range(num_candidates):
        g = candidates[c]
        refill = g.refill
        r = g.fill_rate if refill else g.rate
        found = None
        for link in g.path:
            known = link.vio_sat
            if known == _UNKNOWN:
                known = link.vio_sat = (
                    _SAT if link.rate_high + link.rate_low >= link.capacity_bytes_per_s * tol else _UNSAT
                )
                put_at(links, num_links, link)
                num_links += 1
            if known == _UNSAT:
                continue
            t = link.vio_top
            if t < 0.0:
                # Only the re-filled groups have new rates, and they cross only the links of `new_links`.
                t = link.vio_top = _top_rate(link) if link.vio_new else cached_top_rate(link)
            if r >= t * tol:
                found = link
                break
        if found is not None:
            set_bottleneck(g, found)
            continue
        if not refill:
            if not g.vio_seen:
                g.vio_seen = True
                put_at(refilled, num_grown, g)
                num_grown += 1
            continue
        # A re-filled group under a faster fixed one: the fixed ones must give way. Only those on its
        # saturated links and faster than it can (fill froze it at a saturated link, where a faster
        # group is fixed, or the condition would hold there); an unsaturated DRAM crossed by every path
        # of its node would otherwise pull in all of them. If none is found, all groups on its links.
        gave_way = False
        for link in g.path:
            if link.vio_sat != _SAT:
                continue
            slots = link.group_slots
            for j in range(link.num_groups):
                h = slots[j]
                if not h.refill and h.rate * tol > r:
                    gave_way = True
                    if not h.vio_seen:
                        h.vio_seen = True
                        put_at(refilled, num_grown, h)
                        num_grown += 1
        if not gave_way:
            for link in g.path:
                slots = link.group_slots
                for j in range(link.num_groups):
                    h = slots[j]
                    if not h.refill and not h.vio_seen:
                        h.vio_seen = True
                        put_at(refilled, num_grown, h)
                        num_grown += 1
    for k in range(num_links):
        link = links[k]
        link.vio_new = False
        link.vio_sat = _UNKNOWN
        link.vio_top = -1.0
    free_slots(candidates, num_candidates)
    for i in range(num_refilled, num_grown):
        refilled[i].vio_seen = False
    return num_grown


# `Link.vio_sat`: saturated, as `find_violations` has worked it out so far.
_UNKNOWN: Final = 0
_UNSAT: Final = 1
_SAT: Final = 2


def _free(link: Link, used: float) -> float:
    """`fill`'s residual for one group on `link`: what the link has left plus the group's own `used`."""
    free = link.capacity_bytes_per_s - link.rate_high - link.rate_low + used
    return free if free >= 0.0 else 0.0
