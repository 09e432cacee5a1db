"""Decode engines (DEs) of one node, lock-stepped, advanced in whole runs of steps.

NOTE: a decode step's time is constant while the batch is unchanged, so a driver need not take one
event per step: the core gives it runs up to the next batch change (`steps_to_next_batch_change`, a
last token; `ClusterCore.start_decode_run` caps them), and `advance(steps)` returns every token of
interest of the run (a second token, a filled Full Block to persist, a last token) with the step it
came at. Runs of any length see the same events.

Requests are tracked lazily against the node's step counter: each running request has one record
(`_Running`: where it joined, its next event step), so a run costs O(events), not O(requests), and
events come out by (step, request id). `Request.generated_tokens` is brought up to date whenever one
of its events is processed.

NOTE: the records wait on a wheel of slots by step (`_wheel`: slot `step % len(_wheel)`), not in a
heap. A request's next event is never more than a Full Block of tokens away (its second token, its
block filling, or its last token, whichever comes first), so every record lies within the wheel's span
ahead of the node's step, and a slot holds the records of one step only, chained through the records
themselves (`_Running.next_due`) in request id order. A run takes the slots of its steps in order and
walks each chain: no comparison with records of other steps, which a heap makes ≈ 2 log2(batch) times
per event, each a load of another request's record (at hundreds of requests per node and tens of
thousands cluster-wide, mostly cache misses: benchmarks/README.md), and no list per slot to write
into. The last tokens stay in a heap (`_finish_heap`): they lie anywhere ahead, and only a run's start
asks for the first. The heap is the node's own (`_heap_push`/`_heap_pop`: `heapq`'s algorithm on the
entries' integer fields, no tuple and no call through `heapq` per comparison).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, final

from mypy_extensions import i64, mypyc_attr

from dualpath.records import fields_repr
from dualpath.request import Request


@dataclass
class DecodeEngine:
    engine_id: int
    node_id: int
    hbm_tokens: int  # KV capacity for requests (§6.2 free HBM)
    reserved_tokens: int = 0  # Σ len_r of requests placed here and not finished
    seq: int = 0
    running: int = 0  # requests in the continuous batch
    ctx_base: int = 0  # Σ (kv_tokens at join - join step) over running requests

    @property
    def free_hbm_tokens(self) -> int:
        return self.hbm_tokens - self.reserved_tokens


_DECODE_EVENT_FIELDS = (
    "request",
    "step",
    "second_token",
    "persist_tokens",
    "persisted_tokens",
    "finished",
)  # slots and repr


# Made and dropped per event: in no reference cycle (it refers to its request, nothing refers back), so
# out of the cyclic GC, and one freed object kept for the next (docs/simulator-native.md).
@mypyc_attr(acyclic=True, free_list_len=1)
class DecodeEvent:
    """A request's token of interest, out of `DecodeNode.advance` (a plain class: see `EngineLoad`)."""

    __slots__ = _DECODE_EVENT_FIELDS

    def __init__(
        self,
        *,
        request: Request,
        step: int,
        second_token: bool,
        persist_tokens: int,
        persisted_tokens: int,
        finished: bool,
    ) -> None:
        self.request = request
        # Absolute step of the (first) event processed; earlier than now when advanced past it.
        self.step = step
        self.second_token = second_token
        self.persist_tokens = persist_tokens  # whole blocks that filled (0 if none)
        self.persisted_tokens = persisted_tokens  # the stored prefix with them: they end here
        self.finished = finished

    def __repr__(self) -> str:
        return fields_repr(self, _DECODE_EVENT_FIELDS)


@mypyc_attr(acyclic=True)  # ints and a request, never referred back to: in no cycle (as `DecodeEvent`)
class _Keyed:
    """A step and a request id, ordered by step, then id (unique, so the order is total). The last-token
    heap holds these; the wheel holds `_Running` records."""

    __slots__ = ("step", "request_id")

    def __init__(self, step: int, request_id: int) -> None:
        self.step = step
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(step={self.step}, request_id={self.request_id})"


@final
@mypyc_attr(acyclic=True)
class _Running(_Keyed):
    """A request in a node's continuous batch: the step it joined at and its tokens then; its `step`
    is that of its next token of interest (its slot on the node's wheel)."""

    __slots__ = ("request", "join_step", "gen_at_join", "next_due", "finished")

    def __init__(self, request: Request, join_step: int, gen_at_join: int, step: int) -> None:
        super().__init__(step, request.request_id)
        self.request = request
        self.join_step = join_step
        self.gen_at_join = gen_at_join
        # The next record of its slot on the wheel (a larger request id), or of `advance`'s list of
        # records going on; None at a chain's end and off the wheel.
        self.next_due: _Running | None = None
        self.finished = False  # its last token is out: off the batch (`DecodeNode._leave`)


# `DecodeNode._running` drops its finished records once they are at least this many and half the list.
_MIN_DONE_RECORDS: Final = 64


def _before(a: _Keyed, b: _Keyed) -> bool:
    """Event order: step, then request id."""
    if a.step != b.step:
        return a.step < b.step
    return a.request_id < b.request_id


def _sift_up(heap: list[_Keyed], pos: i64, entry: _Keyed) -> None:
    """Put `entry` at `pos` or above it, moving the later parents down (as `kernel._sift_up`, whose
    entries are the kernel's events: each heap compares its own type's fields unboxed)."""
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not _before(entry, parent):
            break
        heap[pos] = parent
        pos = parent_pos
    heap[pos] = entry


def _heap_push(heap: list[_Keyed], entry: _Keyed) -> None:
    """`heapq.heappush` with `_before`: the new entry up from the bottom."""
    heap.append(entry)
    _sift_up(heap, len(heap) - 1, entry)


def _heap_pop(heap: list[_Keyed]) -> _Keyed:
    """`heapq.heappop` with `_before` (the hole down to a leaf, the last entry up from there)."""
    last = heap.pop()
    if not heap:
        return last
    top = heap[0]
    end: i64 = len(heap)  # native ints (`i64`): the index arithmetic compiles to plain C
    pos: i64 = 0
    child: i64 = 1
    while child < end:
        right = child + 1
        if right < end and not _before(heap[child], heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    _sift_up(heap, pos, last)
    return top


def _sort(records: list[_Running]) -> None:
    """Sort in event order (`_before`) in place: insertion sort, for the few records of `_overdue`."""
    for i in range(1, len(records)):
        record = records[i]
        j = i - 1
        while j >= 0 and _before(record, records[j]):
            records[j + 1] = records[j]
            j -= 1
        records[j + 1] = record


@dataclass
class DecodeNode:
    node_id: int
    engines: list[DecodeEngine]
    block_tokens: int
    steps_done: int = 0
    reserved_tokens: int = 0  # Σ of its engines' reserved_tokens: the group's Σ tok_e, O(1) per fetch
    joining: list[Request] = field(default_factory=list)
    run_steps: int = 0  # steps of the decode run in flight (`ClusterCore.start_decode_run`); 0: none
    # The running requests' records in merge order, and the same records on the wheel of next events
    # (module NOTE): each slot the first record of its chain, at most len(_wheel) - 1 steps ahead of
    # `steps_done`. Records moved to a step already run (`shorten`) wait in `_overdue`. A finished
    # record stays in `_running` (`finished` set, counted in `_running_done`) until those are half the
    # list: a dict by request id would hash and look up the id, an int object, at every finish.
    _running: list[_Running] = field(default_factory=list)
    _num_running: int = 0
    _running_done: int = 0
    _wheel: list[_Running | None] = field(default_factory=list)
    _overdue: list[_Running] = field(default_factory=list)
    _finish_heap: list[_Keyed] = field(default_factory=list)  # (last-token step, id)

    def engine(self, engine_id: int) -> DecodeEngine:
        return self.engines[engine_id - self.engines[0].engine_id]

    def reserve(self, engine: DecodeEngine, tokens: int) -> None:
        """HBM for a placed request (§6.2): on its engine and in the node's Σ, kept together."""
        engine.reserved_tokens += tokens
        self.reserved_tokens += tokens

    def release(self, engine: DecodeEngine, tokens: int) -> None:
        """The reservation of a request whose last token is out."""
        engine.reserved_tokens -= tokens
        self.reserved_tokens -= tokens

    @property
    def num_running(self) -> int:
        return self._num_running

    def merge_joiners(self) -> bool:
        """Joiners enter the running batch at a step boundary; True if anything is running."""
        for request in self.joining:
            assert request.de_engine is not None
            e = self.engine(request.de_engine)
            e.running += 1
            e.ctx_base += request.kv_tokens - self.steps_done
            running = _Running(
                request, self.steps_done, request.generated_tokens, self._next_event_step(request)
            )
            self._running.append(running)
            self._num_running += 1
            self._put(running)
            last = self.steps_done + max(1, request.gen_tokens - request.generated_tokens)
            _heap_push(self._finish_heap, _Keyed(last, request.request_id))
        self.joining.clear()
        return self._num_running > 0

    def batch_ids(self) -> tuple[int, ...]:
        """Ids of the running requests, in the order they merged."""
        return tuple(r.request_id for r in self._running if not r.finished)

    def _running_record(self, request_id: int) -> _Running | None:
        for running in self._running:
            if running.request_id == request_id and not running.finished:
                return running
        return None

    def _leave(self, running: _Running) -> None:
        """`running` finished: out of the batch's count; the finished records leave the list once they
        are half of it (at least `_MIN_DONE_RECORDS`), so the list stays within twice the batch."""
        running.finished = True
        self._num_running -= 1
        self._running_done += 1
        if self._running_done >= _MIN_DONE_RECORDS and 2 * self._running_done > len(self._running):
            self._running = [r for r in self._running if not r.finished]
            self._running_done = 0

    def shape(self) -> tuple[tuple[int, int], ...]:
        """Per engine (batch size, Σ context tokens) for the cost of the next step."""
        return tuple((e.running, self.context_tokens(e)) for e in self.engines)

    def context_tokens(self, e: DecodeEngine) -> int:
        """Σ context tokens of engine `e`'s running requests at the next step (`shape`'s second field)."""
        return e.ctx_base + e.running * self.steps_done

    def steps_to_next_event(self) -> int:
        """Steps until the next token of interest of any request (inspection: the first filled slot)."""
        if self._overdue:
            return 1
        wheel = self._wheel
        for ahead in range(1, len(wheel)):
            if wheel[(self.steps_done + ahead) % len(wheel)] is not None:
                return ahead
        return 0

    def steps_to_next_batch_change(self) -> int:
        """Steps until a request's last token (the batch shrinks); 0 when nothing runs.

        Second tokens and filled blocks do not change the batch: a driver may run past them and
        process them late (`DecodeEvent.step` says when they happened).
        """
        return max(1, self._finish_heap[0].step - self.steps_done) if self._finish_heap else 0

    def advance(self, steps: int) -> list[DecodeEvent]:
        start = self.steps_done
        self.steps_done = end = start + steps
        events: list[DecodeEvent] = []
        # Records that go on are chained in `later` and go back on the wheel once the run's slots are
        # taken: their next steps lie beyond `end`, and a slot taken in this run could share their residue.
        later: _Running | None = None
        overdue = self._overdue
        if overdue:  # steps at or before `start`: ahead of every record on the wheel
            _sort(overdue)
            for running in overdue:
                later = self._take(running, events, later)
            overdue.clear()
        wheel = self._wheel
        size = len(wheel)
        for step in range(start + 1, min(end, start + size - 1) + 1):
            index = step % size
            record = wheel[index]
            if record is None:
                continue
            wheel[index] = None
            while record is not None:  # the slot's chain, in request id order
                following = record.next_due
                later = self._take(record, events, later)
                record = following
        while later is not None:
            following = later.next_due
            self._put(later)
            later = following
        finish = self._finish_heap
        while finish and finish[0].step <= self.steps_done:
            _heap_pop(finish)
        return events

    def shorten(self, request: Request) -> None:
        """`request.gen_tokens` fell (`ClusterCore.finish_early`): if it runs here, its last token is now at
        step join + (gen_tokens - generated at join), maybe before its next event or even before now
        (its decode node stopped it inside the run just done): its next event moves there, so that the
        next `advance` finishes it with exactly gen_tokens tokens."""
        running = self._running_record(request.request_id)  # a scan: only the runtime ends requests early
        if running is None:  # not in the batch yet: `merge_joiners` reads the new gen_tokens
            return
        last = running.join_step + max(0, request.gen_tokens - running.gen_at_join)
        if running.step > last:
            if running.step > self.steps_done:
                self._unchain(running)
            else:  # shortened before, to a step already run
                self._overdue.remove(running)
            running.step = last
            if last > self.steps_done:
                self._put(running)
            else:
                self._overdue.append(running)
        _heap_push(self._finish_heap, _Keyed(last, request.request_id))

    def _take(self, running: _Running, events: list[DecodeEvent], later: _Running | None) -> _Running | None:
        """`running`'s event into `events`; the chain of records going on (`later`), with it in front
        unless it finished."""
        event = self._process(running)
        events.append(event)
        if event.finished:
            running.next_due = None
            return later
        running.next_due = later
        return running

    def _process(self, running: _Running) -> DecodeEvent:
        """The event of `running` at its `step` (≤ now): its tokens brought up to date, and its `step`
        moved to its next event's unless it finished."""
        request = running.request
        step = running.step
        before = request.generated_tokens
        generated = running.gen_at_join + self.steps_done - running.join_step
        if generated > request.gen_tokens:  # it finished early, inside the steps just advanced (`shorten`)
            generated = request.gen_tokens
        request.generated_tokens = generated
        blocks_end = request.kv_tokens // self.block_tokens * self.block_tokens
        persist = max(0, blocks_end - request.persisted_tokens)
        request.persisted_tokens += persist
        finished = request.generated_tokens >= request.gen_tokens
        assert request.de_engine is not None
        e = self.engine(request.de_engine)
        if finished:
            self._leave(running)
            e.running -= 1
            # What `merge_joiners` added to ctx_base for it (its kv_tokens then, less the join step).
            e.ctx_base -= request.prompt_tokens + max(0, running.gen_at_join - 1) - running.join_step
        else:
            running.step = self._next_event_step(request)
        return DecodeEvent(
            request=request,
            step=step,
            second_token=before < 2 <= request.generated_tokens,
            persist_tokens=persist,
            persisted_tokens=request.persisted_tokens,
            finished=finished,
        )

    def _put(self, running: _Running) -> None:
        """`running` on the wheel at its `step` (after `steps_done`), in its slot's chain by request id.
        The wheel spans a Full Block of steps and one more (module NOTE), made at the first record and
        widened if a record lies further ahead (not expected: its tokens would be ahead of its stored
        blocks by more than a block), its records then put again."""
        ahead = running.step - self.steps_done
        if ahead >= len(self._wheel):
            self._widen(ahead)
        wheel = self._wheel
        index = running.step % len(wheel)
        head = wheel[index]
        request_id = running.request_id
        if head is None or request_id < head.request_id:
            running.next_due = head
            wheel[index] = running
            return
        previous = head
        following = head.next_due
        while following is not None and following.request_id < request_id:
            previous = following
            following = following.next_due
        running.next_due = following
        previous.next_due = running

    def _widen(self, ahead: int) -> None:
        """A wheel that spans `ahead` steps at least, every record put again."""
        records = self._chained()
        self._wheel = [None] * max(self.block_tokens + 1, ahead + 1, 2 * len(self._wheel))
        for record in records:
            self._put(record)

    def _unchain(self, running: _Running) -> None:
        """Take `running` off its slot's chain (an early finish: rare)."""
        index = running.step % len(self._wheel)
        record = self._wheel[index]
        if record is running:
            self._wheel[index] = running.next_due
        else:
            while record is not None and record.next_due is not running:
                record = record.next_due
            assert record is not None, f"request {running.request_id} is not on its slot"
            record.next_due = running.next_due
        running.next_due = None

    def _chained(self) -> list[_Running]:
        """Every record on the wheel, slot by slot, each slot's in its chain's order."""
        records: list[_Running] = []
        for head in self._wheel:
            record = head
            while record is not None:
                records.append(record)
                record = record.next_due
        return records

    def _next_event_step(self, request: Request) -> int:
        """Absolute step of the request's next second-token / block-full / last-token event."""
        g = request.generated_tokens
        until_last = request.gen_tokens - g
        until_block = request.persisted_tokens + self.block_tokens - request.kv_tokens
        until = 1 if g < 2 else min(until_last, until_block)
        return self.steps_done + max(1, until)

    def check_invariants(self) -> None:
        live = [r for r in self._running if not r.finished]
        assert len(live) == self._num_running == sum(e.running for e in self.engines)
        assert len(self._running) - len(live) == self._running_done
        chained = self._chained()
        waiting = self._overdue + chained
        assert sorted(r.request_id for r in waiting) == sorted(r.request_id for r in live)  # one event each
        assert {id(r) for r in waiting} == {id(r) for r in live}
        assert all(r.step <= self.steps_done for r in self._overdue)
        size = len(self._wheel)
        for index, record in enumerate(self._wheel):  # each slot: one step, within the span, ids rising
            while record is not None:
                assert record.step % size == index and 0 < record.step - self.steps_done < size
                following = record.next_due
                assert following is None or (
                    following.step == record.step and following.request_id > record.request_id
                )
                record = following
        for e in self.engines:
            assert 0 <= e.reserved_tokens <= max(e.hbm_tokens, e.reserved_tokens)
        assert self.reserved_tokens == sum(e.reserved_tokens for e in self.engines)
