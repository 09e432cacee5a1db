"""Fluid link network: byte transfers sharing links max-min fairly, with two traffic classes.

A `Link` is one direction of one physical resource (a NIC's rx or tx, a half-duplex DRAM, a PCIe
direction, the storage cluster). A `Flow` moves `size_bytes` across a path of 1–4 links. Between
events every flow moves at a constant rate; rates change only when a flow starts or ends, so the
simulator fires no events while bytes are in flight (DESIGN §4 "sim").

NOTE: rate allocation (paper §5.1: InfiniBand VL arbitration by WRR, ≈99 % to high priority)

    1. HIGH flows: max-min fair, each link offering `high_priority_share × capacity` when LOW flows
       are also on it, the full capacity otherwise;
    2. LOW flows: max-min fair over what HIGH left;
    3. HIGH flows: max-min fair again over whatever is still unused (work conservation).

With both classes saturating a link this gives the WRR split 99:1; a class alone gets the whole link;
a class that cannot use its share leaves it to the other. Within a class, flows share max-min fairly
(progressive filling: repeatedly freeze the flows of the link with the smallest fair share).

Recomputation is coalesced: starting or ending a flow only marks its group dirty and asks for one
rate update at the end of the instant, after every other event of it (`Simulator.at_instant_end`), so
ten flows started by one callback cost one recomputation. Flows of one (class, path) form a
`FlowGroup` with one virtual clock and one kernel event (`links_fill`). With one class active the update
re-fills only the groups the change can reach (`LinkNetwork._incremental`); with both, the dirty groups'
connected component is recomputed with the three passes. Either way the result is exact, equal to the
original per-flow code kept in tests/sim/links_reference.py (tests/sim/test_links_equivalence.py), so
`max_component_flows` (a cap that traded exactness for speed there) is accepted and ignored here.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any, Final, TypeVar

from mypy_extensions import i64, mypyc_attr

from dualpath.sim.kernel import EventHandle, Simulator
from dualpath.sim.links_fill import (
    FlowGroup,
    add_group,
    bottlenecked_on,
    fill,
    fill_into,
    find_violations,
    flow_heap_pop,
    flow_heap_push,
    free_slots,
    put_at,
    remove_group,
    set_bottleneck,
    was_saturated,
)

_Arg = TypeVar("_Arg")  # a one-argument transfer's argument (`LinkNetwork.start_flow_one`)
# Where the rate update used to sit in the kernel's order: after every ordinary event of the instant
# (kernel priorities are small integers). `Simulator.at_instant_end` now gives that order without an event.
RATE_UPDATE_PRIORITY: Final = 1 << 30
# Two rates closer than this (relative) are the same rate: avoids rescheduling completions for noise.
_RATE_RTOL: Final = 1e-9


class TrafficClass(IntEnum):
    """Paper §5.1: model traffic rides the high-priority VL, KV traffic the low-priority one."""

    HIGH = 0
    LOW = 1


class Link:
    """One direction of a shared resource with a capacity in bytes/s and a per-transfer latency."""

    # NOTE: the native build lays the fields out in the order `__init__` first sets them: first what
    # every flow's start and end and every rate change write (load, bytes carried), then what the rate
    # update's violation check reads, then the fill's scratch; the flags side by side. A flow's start
    # or end then reads the first one or two of a link's cache lines, the violation check one more.
    __slots__ = (
        "capacity_bytes_per_s",
        "rate_high",
        "rate_low",
        "num_flows",
        "_last_s",
        "_bytes_high",
        "_bytes_low",
        "_record",
        "top_rate",
        "sat_update",
        "sat_before",
        "vio_new",
        "fill_touched",
        "vio_sat",
        "vio_load",
        "vio_top",
        "group_slots",
        "num_groups",
        "bottleneck_slots",
        "num_bottlenecked",
        "fill_count",
        "fill_residual",
        "fill_start",
        "fill_len",
        "fill_order",
        "fill_share",
        "fill_pos",
        "latency_s",
        "name",
    )

    def __init__(
        self, name: str, capacity_bytes_per_s: float, *, latency_s: float = 0.0, record: bool = False
    ):
        if capacity_bytes_per_s <= 0.0:
            raise ValueError(f"link {name!r}: capacity must be positive, got {capacity_bytes_per_s}")
        if latency_s < 0.0:
            raise ValueError(f"link {name!r}: latency must be >= 0, got {latency_s}")
        self.capacity_bytes_per_s = float(capacity_bytes_per_s)
        self.rate_high = 0.0
        self.rate_low = 0.0
        self.num_flows = 0  # active flows now
        self._last_s = 0.0
        self._bytes_high = 0.0
        self._bytes_low = 0.0
        self._record: list[tuple[float, float]] | None = [(0.0, 0.0)] if record else None
        self.top_rate = 0.0  # largest per-flow rate of its groups; < 0: stale (links_fill.cached_top_rate)
        # Of a rate update (`links_fill.was_saturated`): saturated before this instant's changes, recorded
        # for the update numbered `sat_update` (a record of an earlier update is stale; 0: none yet).
        self.sat_update: i64 = 0
        self.sat_before = False
        # Scratch of `links_fill.find_violations` (reset when it returns): crossed by a re-filled group,
        # saturated (0 unknown, 1 no, 2 yes), its load with the new rates, its largest rate (< 0 unknown).
        self.vio_new = False
        self.fill_touched = False  # `links_fill.fill`'s: in the heap fill's list of links a freeze changed
        self.vio_sat: i64 = 0
        self.vio_load = 0.0
        self.vio_top = -1.0
        # Flow groups crossing it, in the order they joined: the first `num_groups` of `group_slots`, a list
        # that keeps its slots (`add_group`, `remove_group`); groups whose remembered bottleneck it is, the
        # first `num_bottlenecked` of `bottleneck_slots`, likewise (`set_bottleneck`). Lists, not dicts: a
        # link holds a few groups at a time (7 at most in mid-run censuses of 12P24D and 48P96D), so a
        # removal's scan is short, and the fill's loops over them index an array, not dict entries.
        self.group_slots: list[FlowGroup] = []
        self.num_groups: i64 = 0
        self.bottleneck_slots: list[FlowGroup] = []
        self.num_bottlenecked: i64 = 0
        # Scratch of `links_fill.fill` (its NOTE): unfrozen flows (0 between fills), bytes/s left, the
        # groups to fill here (`fill_len` slots of the fill's list from `fill_start`; 0 between fills)
        # and the link's place in the fill's order.
        self.fill_count = 0
        self.fill_residual = 0.0
        self.fill_start: i64 = 0
        self.fill_len: i64 = 0
        self.fill_order: i64 = 0
        self.fill_share = 0.0  # its fair share (residual / unfrozen flows) in the heap fill's heap
        self.fill_pos: i64 = -1  # its place in that heap (-1: not in it)
        self.latency_s = float(latency_s)
        self.name = name

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.capacity_bytes_per_s:.4g} B/s, {self.num_flows} flows)"

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_high + self.rate_low

    @property
    def groups(self) -> list[FlowGroup]:
        """The flow groups crossing it, in the order they joined (a new list: inspection and tests)."""
        return self.group_slots[: self.num_groups]

    @property
    def bottlenecked(self) -> list[FlowGroup]:
        """The groups whose remembered bottleneck it is, in the order they got it (a new list: inspection)."""
        return self.bottleneck_slots[: self.num_bottlenecked]

    @property
    def flows(self) -> tuple[Flow, ...]:
        """Active flows on this link (inspection only: O(flows))."""
        return tuple(flow for g in self.groups for flow in sorted(g.queued(), key=_seq) if flow.active)

    def bytes_carried(self, now_s: float) -> float:
        """Bytes that crossed this link from time 0 to `now_s` (>= the last rate change)."""
        high, low = self.bytes_carried_by_class(now_s)
        return high + low

    def bytes_carried_by_class(self, now_s: float) -> tuple[float, float]:
        """(HIGH bytes, LOW bytes) carried up to `now_s`."""
        dt = now_s - self._last_s
        return self._bytes_high + self.rate_high * dt, self._bytes_low + self.rate_low * dt

    def utilisation_record(self) -> list[tuple[float, float]]:
        """Piecewise-constant aggregate rate: [(time_s, rate_bytes_per_s from then on), ...]."""
        if self._record is None:
            raise ValueError(f"link {self.name!r} was created without record=True")
        return list(self._record)

    def _add_rate(self, now_s: float, high: bool, delta: float) -> None:
        """Settle the bytes so far, then change the class's aggregate rate by `delta`.

        NOTE: `LinkNetwork`'s hot paths inline this body (≈1 M calls at 128 agents); keep them in step.
        """
        dt = now_s - self._last_s
        if dt > 0.0:
            self._bytes_high += self.rate_high * dt
            self._bytes_low += self.rate_low * dt
        self._last_s = now_s
        if self.num_flows == 0:
            self.rate_high = self.rate_low = 0.0  # exact zero, no float residue
        elif high:
            self.rate_high += delta
        else:
            self.rate_low += delta
        if self._record is not None:
            self._note_rate(now_s)

    def _note_rate(self, now_s: float) -> None:
        record = self._record
        assert record is not None
        rate = self.rate_high + self.rate_low
        if record[-1][0] == now_s:
            record.pop()
        if not record or record[-1][1] != rate:
            record.append((now_s, rate))


def _seq(flow: Flow) -> int:
    return flow._seq


@mypyc_attr(free_list_len=1)  # one made and one freed per transfer: a freed one kept for the next
class Flow:
    """A transfer of `size_bytes` across `path`; `on_done(*args)` runs when the last byte arrives, or
    `on_done(arg)` when `args` is None (`LinkNetwork.start_flow_one`)."""

    __slots__ = (
        "size_bytes",
        "traffic_class",
        "path",
        "on_done",
        "args",
        "arg",
        "start_s",
        "finish_s",
        "done",
        "active",
        "_group",
        "_tag",
        "_seq",
        "_remaining",
        "_handle",
    )

    def __init__(
        self,
        size_bytes: float,
        path: tuple[Link, ...],
        traffic_class: TrafficClass,
        on_done: Callable[..., object],
        args: tuple[Any, ...] | None,
        arg: object = None,
    ):
        self.size_bytes = size_bytes
        self.traffic_class = traffic_class
        self.path = path
        self.on_done = on_done
        self.args = args
        self.arg = arg
        self.start_s = -1.0  # when it began competing for bandwidth (after latency)
        self.finish_s = -1.0
        self.done = False
        self.active = False
        self._group: FlowGroup | None = None
        self._tag = 0.0  # finish tag on its group's virtual clock
        self._seq: i64 = 0  # when it joined its group (`LinkNetwork._seq`): the tie-break of equal tags
        self._remaining = float(size_bytes)  # while not active
        self._handle: EventHandle | None = None  # latency / zero-byte event

    def __repr__(self) -> str:
        names = ",".join(link.name for link in self.path)
        return f"Flow({self.size_bytes:.4g} B, {self.traffic_class.name}, [{names}], {self.rate_bytes_per_s:.4g} B/s)"

    def __lt__(self, other: Flow) -> bool:
        """Order in its group's heap: finish tag, then join order (unique, so the order is total)."""
        if self._tag != other._tag:
            return self._tag < other._tag
        return self._seq < other._seq

    @property
    def rate_bytes_per_s(self) -> float:
        group = self._group
        return group.rate if self.active and group is not None else 0.0

    def remaining_bytes(self, now_s: float) -> float:
        group = self._group
        if not self.active or group is None:
            return 0.0 if self.done else self._remaining
        served = group.vtime_bytes + group.rate * (now_s - group.last_s)
        return max(0.0, self._tag - served)


def _no_callback() -> None:
    """What the placeholder flow would call: nothing (it never runs)."""


# What a group's freed heap slot holds (`LinkNetwork._detach`): a placeholder, never a flow of the network.
_NO_FLOW: Final = Flow(0.0, (), TrafficClass.LOW, _no_callback, None)


class LinkNetwork:
    """All links of a simulated cluster and the flows crossing them, driven by one `Simulator`."""

    __slots__ = (
        "sim",
        "high_priority_share",
        "max_component_flows",
        "links",
        "flows_started",
        "flows_completed",
        "recomputes",
        "_num_groups",
        "_num_high",
        "_num_low",
        "_was_mixed",
        "_seq",
        "_dirty_groups",
        "_spare_groups",
        "_num_spare",
        "_num_dirty",
        "_fill_members",
        "_fill_links",
        "_refilled",
        "_frozen",
        "_vio_links",
        "_vio_groups",
        "_update_number",
        "_update_pending",
        "_group_due_callback",
        "_update_callback",
    )

    def __init__(
        self, sim: Simulator, *, high_priority_share: float = 0.99, max_component_flows: int | None = None
    ):
        if not 0.0 < high_priority_share < 1.0:
            raise ValueError(f"high_priority_share must be in (0, 1), got {high_priority_share}")
        if max_component_flows is not None and max_component_flows < 1:
            raise ValueError("max_component_flows must be >= 1 or None")
        self.sim = sim
        self.high_priority_share = high_priority_share
        self.max_component_flows = max_component_flows  # accepted for compatibility; allocation is exact
        self.links: dict[str, Link] = {}
        self.flows_started = 0
        self.flows_completed = 0
        self.recomputes = 0
        # A path with active flows has one flow group per class, found on its links (`_group_of`). An
        # emptied group leaves its links (`_detach`) and the path's next flow makes a new one: a large
        # cluster has tens of thousands of paths (one per PE GPU and DE node pair and direction) but a
        # few hundred active at a time, and kept groups were memory that every flow's start missed in
        # (benchmarks/README.md). An emptied group is kept as a spare after the rate update of its
        # instant, and the next new group of any path is the last spare renewed (`FlowGroup.renew`):
        # no group and heap list made and freed per transfer, and the memory reused is warm. The spares
        # are the first `_num_spare` of the list (`links_fill.put_at`).
        self._spare_groups: list[FlowGroup] = []
        self._num_spare: i64 = 0
        self._num_groups: i64 = 0
        self._num_high: i64 = 0  # active flows per class: the fast path needs one class only
        self._num_low: i64 = 0
        self._was_mixed = False
        self._seq: i64 = 0
        # The groups changed this instant (`FlowGroup.dirty`), in order: the first `_num_dirty` of the
        # list, whose slots stay for the next instant (`links_fill.put_at`).
        self._dirty_groups: list[FlowGroup] = []
        self._num_dirty: i64 = 0
        # Every fill's groups per link, a run of slots per link, and its links (`links_fill.fill_into`);
        # the incremental update's re-filled groups and the groups as they froze: kept for the next update.
        self._fill_members: list[FlowGroup] = []
        self._fill_links: list[Link] = []
        self._refilled: list[FlowGroup] = []
        self._frozen: list[FlowGroup] = []
        # `find_violations`' links and candidate groups, kept for the next update likewise.
        self._vio_links: list[Link] = []
        self._vio_groups: list[FlowGroup] = []
        # The pending rate update's number (from 1): stamps the links' `sat_before` records of it.
        self._update_number: i64 = 1
        self._update_pending = False
        # The bound methods handed to the kernel, made once (not one method object per event).
        self._group_due_callback: Callable[[FlowGroup], None] = self._group_due
        self._update_callback: Callable[[], None] = self._update_rates

    @property
    def num_groups(self) -> int:
        """Flow groups with active flows (one per class and path)."""
        return self._num_groups

    def add_link(
        self, name: str, capacity_bytes_per_s: float, *, latency_s: float = 0.0, record: bool = False
    ) -> Link:
        if name in self.links:
            raise ValueError(f"duplicate link name {name!r}")
        link = Link(name, capacity_bytes_per_s, latency_s=latency_s, record=record)
        link._last_s = self.sim.now_s
        if record:
            link._record = [(self.sim.now_s, 0.0)]
        self.links[name] = link
        return link

    def start_flow(
        self,
        size_bytes: float,
        path: Sequence[Link],
        traffic_class: TrafficClass,
        on_done: Callable[..., object],
        *args: Any,
        extra_latency_s: float = 0.0,
    ) -> Flow:
        """Begin a transfer; it competes for bandwidth after the path's latencies + `extra_latency_s`."""
        if size_bytes < 0.0:
            raise ValueError(f"flow size must be >= 0, got {size_bytes}")
        if not path:
            raise ValueError("a flow needs at least one link")
        flow = Flow(size_bytes, tuple(path), traffic_class, on_done, args)
        self._start(flow, extra_latency_s)
        return flow

    def start_flow_one(
        self, size_bytes: float, path: tuple[Link, ...], traffic_class: TrafficClass,
        on_done: Callable[[_Arg], object], arg: _Arg,
    ) -> Flow:  # fmt: skip
        """`start_flow(size_bytes, path, traffic_class, on_done, arg)`: the common one-argument callback,
        with no tuple of arguments made, kept and unpacked per transfer (`Simulator.schedule_one`)."""
        if size_bytes < 0.0:
            raise ValueError(f"flow size must be >= 0, got {size_bytes}")
        if not path:
            raise ValueError("a flow needs at least one link")
        flow = Flow(size_bytes, path, traffic_class, on_done, None, arg)
        self._start(flow, 0.0)
        return flow

    def _start(self, flow: Flow, extra_latency_s: float) -> None:
        size_bytes = flow.size_bytes
        self.flows_started += 1
        delay_s = extra_latency_s
        for link in flow.path:
            delay_s += link.latency_s
        if size_bytes == 0.0:
            flow._handle = self.sim.schedule_one(delay_s, self._finish_empty, flow)
        elif delay_s > 0.0:
            flow._handle = self.sim.schedule_one(delay_s, self._activate, flow)
        else:
            self._activate(flow)

    def abort_flow(self, flow: Flow) -> None:
        """Drop a flow (fault injection): its bandwidth is freed and `on_done` never runs."""
        if flow.done:
            return
        if flow._handle is not None:
            self.sim.cancel(flow._handle)
            flow._handle = None
        if flow.active:
            self._detach(flow)  # its heap entry stays and is skipped (lazy deletion)
        flow.done = True

    # -- flows joining and leaving groups --------------------------------------------------------

    def _activate(self, flow: Flow) -> None:
        now_s = self.sim.now_s
        flow.active = True
        flow.start_s = now_s
        flow._handle = None
        high = flow.traffic_class is TrafficClass.HIGH
        path = flow.path
        group = _group_of(path, high)
        if group is None:  # a new group, onto its links at the end of each link's order
            spare = self._num_spare
            if spare:  # an emptied one, renewed (the last one emptied: its memory is the warmest)
                spare -= 1
                self._num_spare = spare
                group = self._spare_groups[spare]
                group.renew(path, high, now_s)
            else:
                group = FlowGroup(path, high, now_s)
            self._num_groups += 1
            for link in path:
                add_group(link, group)
        self._mark_dirty(group)
        rate = group.rate  # joins at its group's rate until the update at the end of this instant
        group.vtime_bytes += rate * (now_s - group.last_s)
        group.last_s = now_s
        group.num_flows += 1
        if high:
            self._num_high += 1
        else:
            self._num_low += 1
        self._seq += 1
        flow._group = group
        flow._tag = group.vtime_bytes + flow.size_bytes
        flow._seq = self._seq
        flow_heap_push(group, flow)
        for link in path:
            link.num_flows += 1
            if rate > 0.0:
                dt = now_s - link._last_s
                if dt > 0.0:  # Link._add_rate inlined
                    link._bytes_high += link.rate_high * dt
                    link._bytes_low += link.rate_low * dt
                link._last_s = now_s
                if link.num_flows == 0:
                    link.rate_high = link.rate_low = 0.0
                elif high:
                    link.rate_high += rate
                else:
                    link.rate_low += rate
                if link._record is not None:
                    link._note_rate(now_s)

    def _detach(self, flow: Flow) -> None:
        now_s = self.sim.now_s
        group = flow._group
        assert group is not None
        self._mark_dirty(group)
        rate = group.rate
        vtime = group.vtime_bytes = group.vtime_bytes + rate * (now_s - group.last_s)
        group.last_s = now_s
        remaining = flow._tag - vtime
        flow._remaining = remaining if remaining > 0.0 else 0.0
        flow.active = False
        group.num_flows -= 1
        high = group.high
        if high:
            self._num_high -= 1
        else:
            self._num_low -= 1
        path = group.path
        for link in path:
            link.num_flows -= 1
            dt = now_s - link._last_s
            if dt > 0.0:  # Link._add_rate inlined
                link._bytes_high += link.rate_high * dt
                link._bytes_low += link.rate_low * dt
            link._last_s = now_s
            if link.num_flows == 0:
                link.rate_high = link.rate_low = 0.0
            elif high:
                link.rate_high -= rate
            else:
                link.rate_low -= rate
            if link._record is not None:
                link._note_rate(now_s)
        if group.num_flows == 0:  # off its links and its path (an emptied group in this instant's update
            # stays in `_dirty_groups` until the update; the path's next flow makes a new group)
            self._num_groups -= 1
            # Its heap's slots are freed: one past the count may name a flow that left, whose `_group`
            # names the group back (a spare group would keep it alive). Flows still queued here were
            # aborted: none would run.
            heap = group.heap
            for i in range(len(heap)):
                heap[i] = _NO_FLOW
            group.num_queued = 0
            for link in path:
                remove_group(link, group)
                if rate >= link.top_rate:
                    link.top_rate = -1.0  # it may have been the fastest
            set_bottleneck(group, None)
            if group.handle is not None:
                self.sim.cancel(group.handle)
                group.handle = None

    def _mark_dirty(self, group: FlowGroup) -> None:
        if group.dirty:
            return  # already dirty this instant: its links' states before are recorded, the update asked for
        group.dirty = True
        put_at(self._dirty_groups, self._num_dirty, group)
        self._num_dirty += 1
        update = self._update_number
        for link in group.path:
            was_saturated(link, update)  # recorded now, before the change
        if not self._update_pending:
            self._update_pending = True
            self.sim.at_instant_end(self._update_callback)

    def _group_due(self, group: FlowGroup) -> None:
        """The group's smallest finish tag is reached: finish that flow and any with the same tag."""
        group.handle = None
        group.settle(self.sim.now_s)
        top = group.top()
        if top is None:
            return
        # The scheduled flow is done by definition; rounding may leave its tag a hair above the clock.
        if top._tag > group.vtime_bytes:
            group.vtime_bytes = top._tag
        heap = group.heap
        vtime = group.vtime_bytes
        first = flow_heap_pop(group)  # the scheduled flow, `top` (aborted ones were dropped by `top`)
        if not group.num_queued or heap[0]._tag > vtime:
            self._finish(first)  # the common case: one flow ends, no list
            return
        finished = [first]  # others with the same tag: all leave the heap before any callback runs
        while group.num_queued and heap[0]._tag <= vtime:
            flow = flow_heap_pop(group)
            if flow.active:
                finished.append(flow)
        for flow in finished:
            self._finish(flow)

    def _finish(self, flow: Flow) -> None:
        self._detach(flow)
        self._complete(flow)

    def _finish_empty(self, flow: Flow) -> None:
        flow._handle = None
        self._complete(flow)

    def _complete(self, flow: Flow) -> None:
        """A flow's last byte is in (it has left its group, if it had one): mark it done, call `on_done`."""
        flow.done = True
        flow._remaining = 0.0
        flow.finish_s = self.sim.now_s
        self.flows_completed += 1
        on_done = flow.on_done  # a field read; `flow.on_done(*args)` would look it up as a method
        args = flow.args
        if args is None:
            on_done(flow.arg)
        else:
            on_done(*args)

    # -- rate updates ----------------------------------------------------------------------------

    def _update_rates(self) -> None:
        self._update_pending = False
        # Emptied (`_num_dirty` back to 0) at the end: nothing marks a group dirty during the update.
        dirty, n = self._dirty_groups, self._num_dirty
        for i in range(n):
            dirty[i].dirty = False
        mixed = self._num_high > 0 and self._num_low > 0
        # Two classes (or the first update after them): exact three-pass WRR on the whole component.
        if mixed or self._was_mixed:
            refilled = self._two_class(dirty[:n])
            num_refilled: i64 = len(refilled)
        else:
            refilled = self._frozen
            num_refilled = self._incremental(dirty, n)
        self._was_mixed = mixed
        if num_refilled:
            self.recomputes += 1
        self._update_number += 1  # this update's `sat_before` records are stale from now on
        self._apply(refilled, num_refilled, dirty, n)
        for i in range(n):
            g = dirty[i]
            if not g.num_flows:  # emptied in this instant, off its links: a spare for a new path's flows
                put_at(self._spare_groups, self._num_spare, g)
                self._num_spare += 1
        free_slots(dirty, n)  # while these groups are in cache (`links_fill.free_slots`)
        if refilled is self._frozen:
            free_slots(refilled, num_refilled)
        self._num_dirty = 0

    def _incremental(self, dirty: list[FlowGroup], num_dirty: i64) -> i64:
        """NOTE: single-class max-min, re-filling only the groups a change can reach.

            refilled = dirty groups + the groups bottlenecked on their links (saturated, fastest there)
            loop: fill `refilled` within what the other groups leave;
                  stop when every group that could be affected has a bottleneck, else grow `refilled`

        The result meets the bottleneck condition everywhere, so it is *the* max-min allocation (unique),
        the same as re-filling the whole component; typically only a few groups are touched.
        Returns how many groups it re-filled: the first slots of `_frozen`, in the order they froze, each
        with its new rate in `fill_rate` (the caller frees those slots).
        """
        # The re-filled groups, each once (its `refill` flag, reset before returning): the first
        # `num_refilled` slots of a list kept between updates (`links_fill.put_at`), freed at the end.
        refilled = self._refilled
        num_refilled: i64 = 0
        update = self._update_number
        for i in range(num_dirty):
            g = dirty[i]
            if g.num_flows and not g.refill:
                g.refill = True
                put_at(refilled, num_refilled, g)
                num_refilled += 1
            for link in g.path:
                if was_saturated(link, update):
                    num_refilled = bottlenecked_on(link, refilled, num_refilled)
        if not num_refilled:
            return 0
        while True:
            # within what the other groups leave
            num_frozen = fill_into(
                refilled, num_refilled, None, self._fill_members, self._fill_links, self._frozen, None, -1
            )
            grown = find_violations(refilled, num_refilled, update, self._vio_links, self._vio_groups)
            if grown == num_refilled:
                break
            for i in range(num_refilled, grown):  # none of them is re-filled yet (`find_violations`)
                refilled[i].refill = True
            num_refilled = grown
        for i in range(num_refilled):
            refilled[i].refill = False
        free_slots(refilled, num_refilled)
        return num_frozen

    def _two_class(self, dirty: list[FlowGroup]) -> list[FlowGroup]:
        """Paper §5.1 WRR over the dirty groups' connected component (module docstring: three passes).
        Returns the component's groups, each with its new rate in `fill_rate`."""
        groups = _component(dirty)
        if not groups:
            return []
        free: dict[Link, float] = {}
        for g in groups:
            for link in g.path:
                free[link] = link.capacity_bytes_per_s
        high = [g for g in groups if g.high]
        low = [g for g in groups if not g.high]
        if not high or not low:
            frozen_at: dict[FlowGroup, Link] = {}
            frozen = fill(list(groups), free, self._fill_members, frozen_at)
            for g, link in frozen_at.items():  # plain max-min: valid bottlenecks for the fast path
                set_bottleneck(g, link)
            return frozen
        low_links = {link for g in low for link in g.path}
        share = self.high_priority_share
        high_free = {link: cap * share if link in low_links else cap for link, cap in free.items()}
        rates = _rates(fill(high, high_free, self._fill_members))
        for g, r in rates.items():
            for link in g.path:
                free[link] -= g.num_flows * r
        low_rates = _rates(fill(low, dict(free), self._fill_members))
        for g, r in low_rates.items():
            for link in g.path:
                free[link] -= g.num_flows * r
        conserve = {link: max(0.0, f) for link, f in free.items()}
        extra = fill(high, conserve, self._fill_members)  # work conservation
        for g in extra:
            rates[g] += g.fill_rate
        rates.update(low_rates)
        for g, r in rates.items():
            g.fill_rate = r
        return list(rates)

    def _apply(
        self, refilled: list[FlowGroup], num_refilled: i64, dirty: list[FlowGroup], num_dirty: i64
    ) -> None:
        """Set the re-filled groups' (the first `num_refilled` of `refilled`) new rates, their `fill_rate`
        (links settle their bytes first), and move the completion events of those and of the first
        `num_dirty` groups of `dirty`."""
        now_s = self.sim.now_s
        # The groups whose rate moved are marked (`rate_moved`, reset below) rather than listed; the last
        # loop finds them again in `refilled`, which holds each group once (a fill freezes each once).
        for k in range(num_refilled):
            g = refilled[k]
            new = g.fill_rate
            old = g.rate
            if old > 0.0 and abs(new - old) <= _RATE_RTOL * old:
                continue
            if new <= 0.0:
                new = 1e-300  # never stall forever (only reachable through float residue)
            g.vtime_bytes += old * (now_s - g.last_s)
            g.last_s = now_s
            g.rate = new
            delta = g.num_flows * (new - old)
            high = g.high
            for link in g.path:
                dt = now_s - link._last_s
                if dt > 0.0:  # Link._add_rate inlined
                    link._bytes_high += link.rate_high * dt
                    link._bytes_low += link.rate_low * dt
                link._last_s = now_s
                if link.num_flows == 0:
                    link.rate_high = link.rate_low = 0.0
                elif high:
                    link.rate_high += delta
                else:
                    link.rate_low += delta
                if link._record is not None:
                    link._note_rate(now_s)
                top = link.top_rate
                if top >= 0.0:  # keep the cached largest rate exact, or mark it stale
                    if new >= top:
                        link.top_rate = new
                    elif old >= top:
                        link.top_rate = -1.0
            g.rate_moved = True
        for i in range(num_dirty):
            g = dirty[i]
            if g.num_flows and not g.rate_moved:
                self._reschedule(g, now_s, False)
        for k in range(num_refilled):
            g = refilled[k]
            if g.rate_moved:
                g.rate_moved = False
                self._reschedule(g, now_s, True)

    def _reschedule(self, g: FlowGroup, now_s: float, rate_changed: bool) -> None:
        heap = g.heap
        while g.num_queued and not heap[0].active:  # drop aborted flows from the top (FlowGroup.top)
            flow_heap_pop(g)
        handle = g.handle
        if not g.num_queued:
            if handle is not None:
                self.sim.cancel(handle)
                g.handle = None
            return
        tag = heap[0]._tag
        if handle is not None and not rate_changed and g.handle_tag == tag:
            return  # same earliest flow, same rate: its event stands
        rate = g.rate
        vtime = g.vtime_bytes = g.vtime_bytes + rate * (now_s - g.last_s)
        g.last_s = now_s
        delay_s = (tag - vtime) / rate
        if not delay_s > 0.0:
            delay_s = 0.0
        g.handle_tag = tag
        if handle is not None:  # its event moves in the kernel's heap, in the order of a new one
            self.sim.move(handle, delay_s)
        else:
            g.handle = self.sim.schedule_one(delay_s, self._group_due_callback, g)


def _group_of(path: tuple[Link, ...], high: bool) -> FlowGroup | None:
    """The group of `path` and class `high` if it has active flows, else None.

    NOTE: found among the groups of the path's link with the fewest (every group of the path crosses
    each of its links; a link holds a few groups at a time), by its path's links, compared by identity
    as tuple equality compares `Link`s: no dict keyed by path, whose every lookup, insertion and
    deletion hashed the path tuple link by link (≈ 3 % of a 2P4D run's instructions, benchmarks/README.md).
    """
    fewest = path[0]
    for link in path:
        if link.num_groups < fewest.num_groups:
            fewest = link
    slots = fewest.group_slots
    for i in range(fewest.num_groups):
        g = slots[i]
        if g.high == high and same_links(g.path, path):
            return g
    return None


def same_links(a: tuple[Link, ...], b: tuple[Link, ...]) -> bool:
    """`a == b` for two paths (links compare by identity), without the generic comparison per link."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    return all(a[i] is b[i] for i in range(len(a)))  # the native build compiles it to a loop


def _rates(groups: list[FlowGroup]) -> dict[FlowGroup, float]:
    """A fill's result as a dict (the two-class passes combine several fills of the same groups)."""
    return {g: g.fill_rate for g in groups}


def _component(seeds: list[FlowGroup]) -> dict[FlowGroup, None]:
    """Live groups connected to the seed groups' links through shared links."""
    seen_links: dict[Link, None] = {}
    frontier = [link for g in seeds for link in g.path]
    groups: dict[FlowGroup, None] = {}
    while frontier:
        link = frontier.pop()
        if link in seen_links:
            continue
        seen_links[link] = None
        slots = link.group_slots
        for i in range(link.num_groups):
            g = slots[i]
            if g not in groups:
                groups[g] = None
                frontier.extend(g.path)
    return groups


def resample_utilisation(
    record: Sequence[tuple[float, float]], start_s: float, end_s: float, step_s: float
) -> list[tuple[float, float]]:
    """Mean rate over each bin [t, t + step_s) of a piecewise-constant `record`: [(t, bytes_per_s)].

    Before the first record entry the rate is 0; after the last one it holds.
    """
    if step_s <= 0.0 or end_s <= start_s:
        raise ValueError("need step_s > 0 and end_s > start_s")
    times = [t for t, _ in record]
    prefix = [0.0]  # prefix[k] = bytes carried from times[0] to times[k]
    for k in range(1, len(record)):
        prefix.append(prefix[-1] + record[k - 1][1] * (times[k] - times[k - 1]))

    def carried(x: float) -> float:
        k = bisect.bisect_right(times, x) - 1
        if k < 0:
            return 0.0
        return prefix[k] + record[k][1] * (x - times[k])

    out: list[tuple[float, float]] = []
    num_bins = max(1, math.ceil((end_s - start_s) / step_s - 1e-9))
    for b in range(num_bins):
        t0 = start_s + b * step_s
        t1 = min(t0 + step_s, end_s)
        out.append((t0, (carried(t1) - carried(t0)) / (t1 - t0)))
    return out
