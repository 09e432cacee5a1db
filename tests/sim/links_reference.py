"""Reference fluid link network: the original per-flow implementation, kept as the exactness oracle.

`dualpath.sim.links.LinkNetwork` must give the same completion times as `ReferenceLinkNetwork` (within
1e-6 relative; `tests/sim/test_links_equivalence.py`). This one recomputes every flow of the dirty
links' connected component on every change and reschedules each flow's completion: O(flows) per event.
The sharing rule is documented in `dualpath.sim.links`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dualpath.sim.kernel import EventHandle, Simulator
from dualpath.sim.links import TrafficClass

# Runs after every ordinary event of the same instant (kernel priorities are small integers).
RATE_UPDATE_PRIORITY = 1 << 30
# Two rates closer than this (relative) are the same rate: avoids rescheduling completions for noise.
_RATE_RTOL = 1e-9


class Link:
    """One direction of a shared resource with a capacity in bytes/s and a per-transfer latency."""

    __slots__ = (
        "name",
        "capacity_bytes_per_s",
        "latency_s",
        "flows",
        "rate_high",
        "rate_low",
        "_last_s",
        "_bytes_high",
        "_bytes_low",
        "_record",
    )

    def __init__(
        self, name: str, capacity_bytes_per_s: float, *, latency_s: float = 0.0, record: bool = False
    ):
        if capacity_bytes_per_s <= 0.0:
            raise ValueError(f"link {name!r}: capacity must be positive, got {capacity_bytes_per_s}")
        if latency_s < 0.0:
            raise ValueError(f"link {name!r}: latency must be >= 0, got {latency_s}")
        self.name = name
        self.capacity_bytes_per_s = float(capacity_bytes_per_s)
        self.latency_s = float(latency_s)
        self.flows: dict[Flow, None] = {}  # active flows, insertion-ordered (deterministic iteration)
        self.rate_high = 0.0
        self.rate_low = 0.0
        self._last_s = 0.0
        self._bytes_high = 0.0
        self._bytes_low = 0.0
        self._record: list[tuple[float, float]] | None = [(0.0, 0.0)] if record else None

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.capacity_bytes_per_s:.4g} B/s, {len(self.flows)} flows)"

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_high + self.rate_low

    @property
    def num_flows(self) -> int:
        return len(self.flows)

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

    def _settle(self, now_s: float) -> None:
        dt = now_s - self._last_s
        if dt > 0.0:
            self._bytes_high += self.rate_high * dt
            self._bytes_low += self.rate_low * dt
        self._last_s = now_s

    def _note_rate(self, now_s: float) -> None:
        record = self._record
        if record is None:
            return
        rate = self.rate_high + self.rate_low
        if record[-1][0] == now_s:
            record.pop()
        if not record or record[-1][1] != rate:
            record.append((now_s, rate))


class Flow:
    """A transfer of `size_bytes` across `path`; `on_done(*args)` runs when the last byte arrives."""

    __slots__ = (
        "size_bytes",
        "traffic_class",
        "path",
        "on_done",
        "args",
        "rate_bytes_per_s",
        "start_s",
        "finish_s",
        "done",
        "active",
        "_remaining",
        "_last_s",
        "_handle",
        "_new_rate",
    )

    def __init__(
        self,
        size_bytes: float,
        path: tuple[Link, ...],
        traffic_class: TrafficClass,
        on_done: Callable[..., object],
        args: tuple[Any, ...],
    ):
        self.size_bytes = size_bytes
        self.traffic_class = traffic_class
        self.path = path
        self.on_done = on_done
        self.args = args
        self.rate_bytes_per_s = 0.0
        self.start_s = -1.0  # when it began competing for bandwidth (after latency)
        self.finish_s = -1.0
        self.done = False
        self.active = False
        self._remaining = float(size_bytes)
        self._last_s = 0.0
        self._handle: EventHandle | None = None
        self._new_rate = 0.0

    def __repr__(self) -> str:
        names = ",".join(link.name for link in self.path)
        return f"Flow({self.size_bytes:.4g} B, {self.traffic_class.name}, [{names}], {self.rate_bytes_per_s:.4g} B/s)"

    def remaining_bytes(self, now_s: float) -> float:
        if not self.active:
            return 0.0 if self.done else self._remaining
        return max(0.0, self._remaining - self.rate_bytes_per_s * (now_s - self._last_s))


class ReferenceLinkNetwork:
    """The original LinkNetwork (same API), one kernel event per flow and a full recompute per change."""

    __slots__ = (
        "sim",
        "high_priority_share",
        "max_component_flows",
        "links",
        "flows_started",
        "flows_completed",
        "recomputes",
        "_dirty",
        "_update_pending",
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
        self.max_component_flows = max_component_flows
        self.links: dict[str, Link] = {}
        self.flows_started = 0
        self.flows_completed = 0
        self.recomputes = 0
        self._dirty: dict[Link, None] = {}
        self._update_pending = False

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
        self.flows_started += 1
        delay_s = extra_latency_s
        for link in flow.path:
            delay_s += link.latency_s
        if size_bytes == 0.0:
            flow._handle = self.sim.schedule(delay_s, self._finish, flow)
        elif delay_s > 0.0:
            flow._handle = self.sim.schedule(delay_s, self._activate, flow)
        else:
            self._activate(flow)
        return flow

    def abort_flow(self, flow: Flow) -> None:
        """Drop a flow (fault injection): its bandwidth is freed and `on_done` never runs."""
        if flow.done:
            return
        if flow._handle is not None:
            self.sim.cancel(flow._handle)
        if flow.active:
            self._detach(flow)
        flow.done = True

    # -- internals -----------------------------------------------------------------------------

    def _activate(self, flow: Flow) -> None:
        now_s = self.sim.now_s
        flow.active = True
        flow.start_s = now_s
        flow._last_s = now_s
        flow._handle = None
        dirty = self._dirty
        for link in flow.path:
            link.flows[flow] = None
            dirty[link] = None
        self._request_update()

    def _finish(self, flow: Flow) -> None:
        if flow.active:
            self._detach(flow)
        flow.done = True
        flow._remaining = 0.0
        flow.finish_s = self.sim.now_s
        self.flows_completed += 1
        flow.on_done(*flow.args)

    def _detach(self, flow: Flow) -> None:
        now_s = self.sim.now_s
        rate = flow.rate_bytes_per_s
        high = flow.traffic_class is TrafficClass.HIGH
        dirty = self._dirty
        for link in flow.path:
            del link.flows[flow]
            link._settle(now_s)
            if not link.flows:
                link.rate_high = link.rate_low = 0.0  # exact zero, no float residue
            elif high:
                link.rate_high -= rate
            else:
                link.rate_low -= rate
            link._note_rate(now_s)
            dirty[link] = None
        flow._remaining = max(0.0, flow._remaining - rate * (now_s - flow._last_s))
        flow.rate_bytes_per_s = 0.0
        flow.active = False
        self._request_update()

    def _request_update(self) -> None:
        if not self._update_pending:
            self._update_pending = True
            self.sim.schedule(0.0, self._update_rates, priority=RATE_UPDATE_PRIORITY)

    def _update_rates(self) -> None:
        self._update_pending = False
        dirty, self._dirty = self._dirty, {}
        flows, links = self._component(dirty)
        if not flows:
            return
        self.recomputes += 1
        if len(flows) == 1:
            self._fast_single(flows[0], links)
        else:
            self._allocate(flows, links)
        self._apply(flows)

    def _component(self, seeds: dict[Link, None]) -> tuple[list[Flow], dict[Link, None]]:
        """Flows reachable from the seed links (all flows on the seeds, then up to the cap)."""
        cap = self.max_component_flows
        seen_flows: dict[Flow, None] = {}
        seen_links: dict[Link, None] = dict(seeds)
        frontier = list(seeds)
        expand = True
        while frontier:
            next_frontier: list[Link] = []
            for link in frontier:
                for flow in link.flows:
                    if flow in seen_flows:
                        continue
                    seen_flows[flow] = None
                    if not expand:
                        continue
                    for other in flow.path:
                        if other not in seen_links:
                            seen_links[other] = None
                            next_frontier.append(other)
            if cap is not None and len(seen_flows) >= cap:
                expand = False
                # Flows on links already reached still join (they may share a link with a seed flow's
                # path); stop growing beyond those.
                for link in next_frontier:
                    for flow in link.flows:
                        seen_flows.setdefault(flow, None)
                for flow in seen_flows:  # every link a member crosses gets a capacity entry
                    for other in flow.path:
                        seen_links.setdefault(other, None)
                break
            frontier = next_frontier
        return list(seen_flows), seen_links

    def _fast_single(self, flow: Flow, links: dict[Link, None]) -> None:
        # Alone in its component: only background (flows outside a capped component) limits it.
        rate = float("inf")
        for link in flow.path:
            free = link.capacity_bytes_per_s - self._background(link, flow)
            rate = min(rate, free)
        flow._new_rate = max(rate, 0.0)

    @staticmethod
    def _background(link: Link, flow: Flow) -> float:
        used = link.rate_high + link.rate_low
        if flow in link.flows:
            used -= flow.rate_bytes_per_s
        return used

    def _allocate(self, flows: list[Flow], links: dict[Link, None]) -> None:
        members = dict.fromkeys(flows)
        free: dict[Link, float] = {}
        for link in links:
            used = 0.0
            for other in link.flows:
                if other not in members:
                    used += other.rate_bytes_per_s
            free[link] = max(0.0, link.capacity_bytes_per_s - used)
        high = [f for f in flows if f.traffic_class is TrafficClass.HIGH]
        low = [f for f in flows if f.traffic_class is not TrafficClass.HIGH]
        if not high or not low:
            _max_min(flows, free, add=False)
            return
        low_links = {link for f in low for link in f.path}
        share = self.high_priority_share
        high_free = {link: cap * share if link in low_links else cap for link, cap in free.items()}
        _max_min(high, high_free, add=False)
        for f in high:
            for link in f.path:
                free[link] -= f._new_rate
        _max_min(low, free, add=False)
        for f in low:
            for link in f.path:
                free[link] -= f._new_rate
        _max_min(high, free, add=True)  # work conservation: HIGH takes what LOW could not use

    def _apply(self, flows: list[Flow]) -> None:
        sim = self.sim
        now_s = sim.now_s
        for flow in flows:
            new = flow._new_rate
            old = flow.rate_bytes_per_s
            if old > 0.0 and abs(new - old) <= _RATE_RTOL * old:
                continue
            if new <= 0.0:
                new = 1e-300  # never stall forever; see _max_min's floor
            flow._remaining = max(0.0, flow._remaining - old * (now_s - flow._last_s))
            flow._last_s = now_s
            flow.rate_bytes_per_s = new
            delta = new - old
            high = flow.traffic_class is TrafficClass.HIGH
            for link in flow.path:
                link._settle(now_s)
                if high:
                    link.rate_high += delta
                else:
                    link.rate_low += delta
                link._note_rate(now_s)
            if flow._handle is not None:
                sim.cancel(flow._handle)
            flow._handle = sim.schedule(flow._remaining / new, self._finish, flow)


def _max_min(flows: list[Flow], free: dict[Link, float], *, add: bool) -> None:
    """Progressive filling: max-min fair rates for `flows` within `free` capacity per link.

    Sets `flow._new_rate` (or adds to it when `add`). `free` is read, not modified.
    """
    residual = dict(free)
    count: dict[Link, int] = {}
    for flow in flows:
        for link in flow.path:
            count[link] = count.get(link, 0) + 1
    unfrozen = dict.fromkeys(flows)
    while unfrozen:
        bottleneck = None
        best = float("inf")
        for link, n in count.items():
            if n:
                fair = residual[link] / n
                if fair < best:
                    best, bottleneck = fair, link
        assert bottleneck is not None
        best = max(best, 0.0)
        for flow in bottleneck.flows:
            if flow not in unfrozen:
                continue
            del unfrozen[flow]
            flow._new_rate = flow._new_rate + best if add else best
            for link in flow.path:
                residual[link] -= best
                count[link] -= 1
