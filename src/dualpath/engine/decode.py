"""Decode engines (DEs) of one node, lock-stepped, advanced in whole runs of steps.

NOTE: a decode step's time is constant while the batch is unchanged, so a driver need not take one
event per step: the core gives it runs up to the next batch change (`steps_to_next_batch_change`, a
last token; `ClusterCore.start_decode_run` caps them), and `advance(steps)` returns every token of
interest of the run (a second token, a filled Full Block to persist, a last token) with the step it
came at. Runs of any length see the same events.

Requests are tracked lazily against the node's step counter: each running request has one record
(`_Running`: where it joined, its next event step) in a heap ordered by (next event step, request id),
so a run costs O(events × log batch), not O(requests), and events come out by (step, request id). The
heaps are the node's own (`_heap_push`/`_heap_pop`: `heapq`'s algorithm on the entries' integer
fields): a record goes back after its event instead of a new entry being made, and two keys compare
without a tuple or a call through `heapq`. `Request.generated_tokens` is brought up to date whenever
one of its events is processed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TypeVar, final

from mypy_extensions import mypyc_attr

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
    """An entry of a node's heaps: a step and a request id, ordered by step, then id (unique, so the
    order is total). The last-token heap holds these; the event heap holds `_Running` records."""

    __slots__ = ("step", "request_id")

    def __init__(self, step: int, request_id: int) -> None:
        self.step = step
        self.request_id = request_id

    def __lt__(self, other: _Keyed) -> bool:
        return _before(self, other)  # for `heapq.heapify` in `DecodeNode.shorten`

    def __repr__(self) -> str:
        return f"{type(self).__name__}(step={self.step}, request_id={self.request_id})"


@final
@mypyc_attr(acyclic=True)
class _Running(_Keyed):
    """A request in a node's continuous batch: the step it joined at and its tokens then; its `step`
    is that of its next token of interest (its key in the node's event heap)."""

    __slots__ = ("request", "join_step", "gen_at_join")

    def __init__(self, request: Request, join_step: int, gen_at_join: int, step: int) -> None:
        super().__init__(step, request.request_id)
        self.request = request
        self.join_step = join_step
        self.gen_at_join = gen_at_join


_K = TypeVar("_K", bound=_Keyed)


def _before(a: _Keyed, b: _Keyed) -> bool:
    """Heap order: step, then request id."""
    if a.step != b.step:
        return a.step < b.step
    return a.request_id < b.request_id


def _sift_up(heap: list[_K], pos: int, entry: _K) -> None:
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


def _heap_push(heap: list[_K], entry: _K) -> None:
    """`heapq.heappush` with `_before`: the new entry up from the bottom."""
    heap.append(entry)
    _sift_up(heap, len(heap) - 1, entry)


def _heap_pop(heap: list[_K]) -> _K:
    """`heapq.heappop` with `_before` (the hole down to a leaf, the last entry up from there)."""
    last = heap.pop()
    if not heap:
        return last
    top = heap[0]
    end = len(heap)
    pos = 0
    child = 1
    while child < end:
        right = child + 1
        if right < end and not _before(heap[child], heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    _sift_up(heap, pos, last)
    return top


@dataclass
class DecodeNode:
    node_id: int
    engines: list[DecodeEngine]
    block_tokens: int
    steps_done: int = 0
    reserved_tokens: int = 0  # Σ of its engines' reserved_tokens: the group's Σ tok_e, O(1) per fetch
    joining: list[Request] = field(default_factory=list)
    run_steps: int = 0  # steps of the decode run in flight (`ClusterCore.start_decode_run`); 0: none
    # The running requests by id, in merge order, and the same records as a heap of next events
    # (module NOTE).
    _running: dict[int, _Running] = field(default_factory=dict)
    _due: list[_Running] = field(default_factory=list)
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
        return len(self._running)

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
            self._running[request.request_id] = running
            _heap_push(self._due, running)
            last = self.steps_done + max(1, request.gen_tokens - request.generated_tokens)
            _heap_push(self._finish_heap, _Keyed(last, request.request_id))
        self.joining.clear()
        return bool(self._running)

    def batch_ids(self) -> tuple[int, ...]:
        """Ids of the running requests, in the order they merged."""
        return tuple(self._running)

    def shape(self) -> tuple[tuple[int, int], ...]:
        """Per engine (batch size, Σ context tokens) for the cost of the next step."""
        return tuple((e.running, self.context_tokens(e)) for e in self.engines)

    def context_tokens(self, e: DecodeEngine) -> int:
        """Σ context tokens of engine `e`'s running requests at the next step (`shape`'s second field)."""
        return e.ctx_base + e.running * self.steps_done

    def steps_to_next_event(self) -> int:
        """Steps until the next token of interest of any request (inspection: the event heap's head)."""
        return max(1, self._due[0].step - self.steps_done) if self._due else 0

    def steps_to_next_batch_change(self) -> int:
        """Steps until a request's last token (the batch shrinks); 0 when nothing runs.

        Second tokens and filled blocks do not change the batch: a driver may run past them and
        process them late (`DecodeEvent.step` says when they happened).
        """
        return max(1, self._finish_heap[0].step - self.steps_done) if self._finish_heap else 0

    def advance(self, steps: int) -> list[DecodeEvent]:
        self.steps_done += steps
        events: list[DecodeEvent] = []
        due = self._due
        # An event's record goes back with a later step (> steps_done): the loop never sees it again.
        while due and due[0].step <= self.steps_done:
            events.append(self._process(_heap_pop(due)))
        finish = self._finish_heap
        while finish and finish[0].step <= self.steps_done:
            _heap_pop(finish)
        return events

    def shorten(self, request: Request) -> None:
        """`request.gen_tokens` fell (`ClusterCore.finish_early`): if it runs here, its last token is now at
        step join + (gen_tokens - generated at join), maybe before its next event or even before now
        (its decode node stopped it inside the run just done): its next event moves there, so that the
        next `advance` finishes it with exactly gen_tokens tokens."""
        running = self._running.get(request.request_id)
        if running is None:  # not in the batch yet: `merge_joiners` reads the new gen_tokens
            return
        last = running.join_step + max(0, request.gen_tokens - running.gen_at_join)
        if running.step > last:
            running.step = last
            heapq.heapify(self._due)  # rare (an early finish): the whole heap, in `_before` order
        _heap_push(self._finish_heap, _Keyed(last, request.request_id))

    def _process(self, running: _Running) -> DecodeEvent:
        """The event of `running` at its `step` (≤ now): its tokens brought up to date; back into
        the heap at its next event unless it finished."""
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
            del self._running[running.request_id]
            e.running -= 1
            # What `merge_joiners` added to ctx_base for it (its kv_tokens then, less the join step).
            e.ctx_base -= request.prompt_tokens + max(0, running.gen_at_join - 1) - running.join_step
        else:
            running.step = self._next_event_step(request)
            _heap_push(self._due, running)
        return DecodeEvent(
            request=request,
            step=step,
            second_token=before < 2 <= request.generated_tokens,
            persist_tokens=persist,
            persisted_tokens=request.persisted_tokens,
            finished=finished,
        )

    def _next_event_step(self, request: Request) -> int:
        """Absolute step of the request's next second-token / block-full / last-token event."""
        g = request.generated_tokens
        until_last = request.gen_tokens - g
        until_block = request.persisted_tokens + self.block_tokens - request.kv_tokens
        until = 1 if g < 2 else min(until_last, until_block)
        return self.steps_done + max(1, until)

    def check_invariants(self) -> None:
        assert sum(e.running for e in self.engines) == len(self._running)
        assert sorted(r.request_id for r in self._due) == sorted(self._running)  # one next event each
        assert all(self._running[r.request_id] is r for r in self._due)
        for e in self.engines:
            assert 0 <= e.reserved_tokens <= max(e.hbm_tokens, e.reserved_tokens)
        assert self.reserved_tokens == sum(e.reserved_tokens for e in self.engines)
