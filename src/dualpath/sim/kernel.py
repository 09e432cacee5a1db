"""The simulator's discrete-event kernel.

Hand-written rather than SimPy (DESIGN §5): the driver pushes hundreds of millions of events through
this loop, so it must be a bare binary heap with no generator/process machinery, and ordering must be
fully deterministic. The shape follows SimPy's `core.Environment`: a heap keyed
`(time_s, priority, seq)`, `seq` a per-simulator counter so that ties run in scheduling order.

NOTE: an `EventHandle` *is* the heap entry, an `Event` with `time_s`, `priority`, `seq`, `callback` and
`args` (or, from `schedule_one`, one `arg` and no tuple: a tuple made per event, unpacked by a generic
call and freed was ≈ 1 % of a 2P4D run's instructions, benchmarks/README.md). Cancelling sets `callback`
to None (lazy cancellation: O(1), the entry is skipped when popped). Entries order by `(time_s,
priority, seq)`, and `seq` is unique, so the order is total. `Event` is a class of its own rather than a
list, and the heap's sifts (`_heap_push`, `_heap_pop`: `heapq`'s algorithm) compare entries with a plain
function (`_earlier`) that the native build calls directly on unboxed fields: `heapq` itself would
compare through the generic rich comparison (a bool object per pair), and a pop compares ≈ log2(heap)
pairs, every event costing ≈ 2 pushes and 1 cancel (12P24D).

The link network moves a flow group's completion event at every rate change (`move`): the entry
takes the key a new event would get (the new time, the next `seq`) and sifts from where it is, its
place kept in `Event.pos` by every sift. So the run order is that of cancelling the event and
scheduling it again, without the cancelled entry that every pop would then sift through (cancelled
and pushed again, most of a 8P16D heap was cancelled entries: ≈ 85 % of ≈ 800) or a new entry made.
For what is cancelled, the kernel counts the cancelled entries still in the heap and, once they are
`COMPACT_MIN_DEAD` or more and outnumber the live ones, drops them all and re-heapifies (O(n) for n/2
cancellations: O(1) amortised per cancel). The order of events is unchanged: it depends only on the
unique `(time_s, priority, seq)` keys, not on the heap's layout.

`at_instant_end(callback)` runs a callback once every event of the current instant has run, before
the clock moves on: what an event at `(now, +inf priority)` would do, without a heap entry. The link
network's coalesced rate update is one per instant with flows starting or ending (≈40 % of all
callbacks at 512 agents), so it skips the push and pop. Such callbacks are not counted as events.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Final, TypeVar, final

from mypy_extensions import i64, mypyc_attr

_Arg = TypeVar("_Arg")  # a one-argument event's argument (`Simulator.schedule_one`)


# The loop frees the entry it ran once the callback returns, and the next callbacks make new ones: a
# freed entry kept for the next `schedule` spares the allocator most pushes (docs/simulator-native.md).
@final
@mypyc_attr(free_list_len=1)
class Event:
    """A heap entry: `callback(*args)` at `time_s`, or `callback(arg)` when `args` is None (`schedule_one`);
    ties run by `priority`, then scheduling order."""

    __slots__ = ("time_s", "priority", "seq", "callback", "args", "arg", "pos")

    def __init__(
        self,
        time_s: float,
        priority: int,
        seq: int,
        callback: Callable[..., object] | None,
        args: tuple[Any, ...] | None,
        arg: object = None,
    ) -> None:
        self.time_s = time_s
        self.priority = priority
        self.seq = seq
        self.callback = callback  # None once run or cancelled
        self.args = args
        self.arg = arg
        self.pos: i64 = -1  # its index in the heap, kept by every sift (`Simulator.move`)

    @property
    def arguments(self) -> tuple[Any, ...]:
        """What the callback is called with."""
        return (self.arg,) if self.args is None else self.args

    def __lt__(self, other: Event) -> bool:
        return _earlier(self, other)  # for `heapq.heapify` in `Simulator._compact`

    def __repr__(self) -> str:
        return f"Event(time_s={self.time_s!r}, priority={self.priority}, seq={self.seq}, callback={self.callback!r})"


EventHandle = Event
"""Opaque handle of a scheduled event; keep it only to pass to `Simulator.cancel`."""

# Compact the heap when at least this many of its entries are cancelled and they outnumber the live
# ones: small heaps (a 2P4D run holds ≈ 50 entries) are cheaper to pop through than to rebuild.
COMPACT_MIN_DEAD: Final = 128


def _earlier(a: Event, b: Event) -> bool:
    """`a < b` for two heap entries, as a plain function: the native build calls it directly and compares
    unboxed fields, where `heapq` goes through the generic comparison (`a.__lt__(b)` returning a bool
    object) for every pair it compares."""
    if a.time_s != b.time_s:
        return a.time_s < b.time_s
    if a.priority != b.priority:
        return a.priority < b.priority
    return a.seq < b.seq


def _sift_up(heap: list[Event], pos: i64, entry: Event, top: i64 = 0) -> None:
    """Put `entry` at `pos` or above it, no higher than `top`, moving the later parents down (`heapq`'s
    `_siftdown`)."""
    while pos > top:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not _earlier(entry, parent):
            break
        heap[pos] = parent
        parent.pos = pos
        pos = parent_pos
    heap[pos] = entry
    entry.pos = pos


def _sift_down(heap: list[Event], pos: i64, entry: Event) -> None:
    """Put `entry` at `pos` or below it: the hole down to a leaf along the earlier child, then `entry`
    up from there, no higher than `pos` (`heapq`'s `_siftup`; the pop's sift from any position)."""
    end: i64 = len(heap)  # native ints (`i64`): the index arithmetic compiles to plain C
    top = pos
    child = 2 * pos + 1
    while child < end:
        right = child + 1
        if right < end and not _earlier(heap[child], heap[right]):
            child = right
        moved = heap[child]
        heap[pos] = moved
        moved.pos = pos
        pos = child
        child = 2 * pos + 1
    _sift_up(heap, pos, entry, top)


def _heap_push(heap: list[Event], entry: Event) -> None:
    """`heapq.heappush(heap, entry)` with `_earlier` (the same sift: new entry up from the bottom)."""
    heap.append(entry)
    _sift_up(heap, len(heap) - 1, entry)


def _heap_pop(heap: list[Event]) -> Event:
    """`heapq.heappop(heap)` with `_earlier` (the same sift: the hole at the root down to a leaf along
    the earlier child, then the last entry up from there). `heap` must not be empty."""
    last = heap.pop()
    if not heap:
        last.pos = -1
        return last
    top = heap[0]
    top.pos = -1
    _sift_down(heap, 0, last)
    return top


class Simulator:
    """A deterministic event loop on virtual time (seconds)."""

    __slots__ = (
        "now_s",
        "events_processed",
        "_heap",
        "_seq",
        "_stopped",
        "_progress",
        "_progress_every",
        "_instant_end_first",
        "_instant_end",
        "_dead",
    )

    def __init__(self, *, start_s: float = 0.0) -> None:
        self.now_s: float = start_s
        self.events_processed: int = 0
        self._heap: list[Event] = []
        self._seq: int = 0
        self._stopped: bool = False
        self._progress: Callable[[Simulator], None] | None = None
        self._progress_every: int = 0
        # Instant-end callbacks in request order: the first in a field of its own, any later ones in the
        # list. The link network asks for one per instant, so the common instant makes and frees no list.
        self._instant_end_first: Callable[[], object] | None = None
        self._instant_end: list[Callable[[], object]] = []
        self._dead: int = 0  # cancelled entries still in the heap (module NOTE)

    def schedule(
        self, delay_s: float, callback: Callable[..., object], *args: Any, priority: int = 0
    ) -> EventHandle:
        """Run `callback(*args)` at `now_s + delay_s`."""
        if delay_s < 0.0:
            raise ValueError(f"cannot schedule {delay_s} s in the past")
        self._seq += 1
        entry = Event(self.now_s + delay_s, priority, self._seq, callback, args)
        _heap_push(self._heap, entry)
        return entry

    def schedule_at(
        self, time_s: float, callback: Callable[..., object], *args: Any, priority: int = 0
    ) -> EventHandle:
        """Run `callback(*args)` at absolute `time_s` (not before `now_s`)."""
        if time_s < self.now_s:
            raise ValueError(f"cannot schedule at {time_s} s, now is {self.now_s} s")
        self._seq += 1
        entry = Event(time_s, priority, self._seq, callback, args)
        _heap_push(self._heap, entry)
        return entry

    def schedule_one(self, delay_s: float, callback: Callable[[_Arg], object], arg: _Arg) -> EventHandle:
        """`schedule(delay_s, callback, arg)`: the common one-argument event, with no tuple of arguments
        made when it is scheduled and unpacked when it runs (most of a run's events: a flow group's
        completion, a flow's start, a prefill step's end, a decode run's end; module NOTE)."""
        if delay_s < 0.0:
            raise ValueError(f"cannot schedule {delay_s} s in the past")
        self._seq += 1
        entry = Event(self.now_s + delay_s, 0, self._seq, callback, None, arg)
        _heap_push(self._heap, entry)
        return entry

    def schedule_one_at(self, time_s: float, callback: Callable[[_Arg], object], arg: _Arg) -> EventHandle:
        """`schedule_at(time_s, callback, arg)` without the tuple (`schedule_one`)."""
        if time_s < self.now_s:
            raise ValueError(f"cannot schedule at {time_s} s, now is {self.now_s} s")
        self._seq += 1
        entry = Event(time_s, 0, self._seq, callback, None, arg)
        _heap_push(self._heap, entry)
        return entry

    def move(self, handle: EventHandle, delay_s: float) -> None:
        """Run a pending event at `now_s + delay_s` instead, ordered as if scheduled now (a new `seq`):
        the same order as cancelling it and scheduling its callback again, without a cancelled entry
        left in the heap or a new one made. The link network moves a flow group's completion at every
        rate change (module NOTE)."""
        if handle.callback is None:
            raise ValueError("cannot move an event that ran or was cancelled")
        if delay_s < 0.0:
            raise ValueError(f"cannot schedule {delay_s} s in the past")
        self._seq += 1
        handle.seq = self._seq
        handle.time_s = self.now_s + delay_s
        heap = self._heap
        pos = handle.pos
        if pos > 0 and _earlier(handle, heap[(pos - 1) >> 1]):
            _sift_up(heap, pos, handle)
        else:
            _sift_down(heap, pos, handle)

    def at_instant_end(self, callback: Callable[[], object]) -> None:
        """Run `callback()` after every event of the current instant (those it schedules at this instant
        included), before time advances; in request order. Not counted in `events_processed`."""
        if self._instant_end_first is None:
            self._instant_end_first = callback
        else:
            self._instant_end.append(callback)

    def _end_instant(self) -> None:
        """Run the callbacks asked for so far (one round). Those they ask for wait for the loop's next round,
        after any event they schedule at this instant."""
        first = self._instant_end_first
        if first is None:
            return
        self._instant_end_first = None
        later = self._instant_end
        if later:
            self._instant_end = []  # swapped out first: what the callbacks ask for goes to a new round
            first()
            for callback in later:
                callback()
        else:
            first()  # the empty list stays: anything `first` asks for lands in the field, then in it

    def cancel(self, handle: EventHandle) -> None:
        """Cancel a pending event; a no-op if it already ran or was cancelled."""
        if handle.callback is None:
            return  # ran (the loop clears a fired entry's callback) or already cancelled
        handle.callback = None
        self._dead += 1
        if self._dead >= COMPACT_MIN_DEAD and 2 * self._dead > len(self._heap):
            self._compact()

    def _compact(self) -> None:
        """Drop every cancelled entry and restore the heap, in place: `run` holds the same list."""
        heap = self._heap
        heap[:] = [entry for entry in heap if entry.callback is not None]
        heapq.heapify(heap)
        for i in range(len(heap)):
            heap[i].pos = i
        self._dead = 0

    def stop(self) -> None:
        """Make the running `run()` return after the current event."""
        self._stopped = True

    def set_progress(self, callback: Callable[[Simulator], None] | None, every_events: int = 100_000) -> None:
        """Call `callback(self)` every `every_events` events during `run()` (None switches it off)."""
        if every_events <= 0:
            raise ValueError("every_events must be positive")
        self._progress = callback
        self._progress_every = every_events

    def next_time_s(self) -> float | None:
        """Time of the next live event, or None when nothing is pending."""
        if self._instant_end_first is not None:
            return self.now_s
        heap = self._heap
        while heap and heap[0].callback is None:
            _heap_pop(heap)
            self._dead -= 1
        return heap[0].time_s if heap else None

    def pending_entries(self) -> int:
        """Heap size, cancelled entries included (a cheap upper bound on pending events)."""
        return len(self._heap)

    def cancelled_entries(self) -> int:
        """Cancelled entries still in the heap (skipped when popped, dropped by a compaction)."""
        return self._dead

    def run(self, until_s: float | None = None, max_events: int | None = None) -> int:
        """Run events with `time_s < until_s` (all when None); return how many callbacks ran."""
        if until_s is not None and until_s < self.now_s:
            raise ValueError(f"until_s={until_s} is before now_s={self.now_s}")
        horizon = float("inf") if until_s is None else until_s
        budget = -1 if max_events is None else max_events
        progress, every = self._progress, self._progress_every
        countdown = every if progress is not None else -1
        heap = self._heap
        ran = 0
        processed = (
            self.events_processed
        )  # kept in a local in the loop, written back for progress and at the end
        self._stopped = False
        # The hot loop: locals only, one pop and one call per event; the instant-end callbacks run when
        # the next live event is later than now (or none is left), as a (now, +inf) entry would.
        now = self.now_s
        inf = float("inf")
        while ran != budget:
            if heap:
                entry = heap[0]
                time_s = entry.time_s
            else:
                time_s = inf
            if time_s > now and self._instant_end_first is not None and now < horizon:
                self._end_instant()
                continue
            if time_s >= horizon:
                break
            _heap_pop(heap)
            callback = entry.callback
            if callback is None:
                self._dead -= 1
                continue
            entry.callback = None  # a fired handle cancels as a no-op
            self.now_s = now = time_s
            args = entry.args
            if args is None:
                callback(entry.arg)
            else:
                callback(*args)
            ran += 1
            countdown -= 1
            if countdown == 0 and progress is not None:
                self.events_processed = processed + ran
                progress(self)
                countdown = every
            if self._stopped:
                break
        self.events_processed = processed + ran
        if until_s is not None and not self._stopped and ran != budget:
            self.now_s = until_s
        return ran
