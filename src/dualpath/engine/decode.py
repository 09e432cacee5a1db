"""Decode engines (DEs) of one node, lock-stepped, advanced in whole runs of steps.

NOTE: a decode step's time is constant while the batch is unchanged, so a driver need not take one
event per step: the core gives it runs up to the next batch change (`steps_to_next_batch_change`, a
last token; `ClusterCore.start_decode_run` caps them), and `advance(steps)` returns every token of
interest of the run (a second token, a filled Full Block to persist, a last token) with the step it
came at. Runs of any length see the same events.

Requests are tracked lazily against the node's step counter (a calendar: each request sits in the
bucket of its next event step, and a small heap holds the steps that have a bucket), so a run costs
O(events), not O(requests); events come out by (step, request id), as from one heap of all requests.
`Request.generated_tokens` is brought up to date whenever one of its events is processed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Final

from dualpath.records import fields_repr
from dualpath.request import Request

# `heapq`'s functions as compiled constants: a call through the module looks the name up in its dict.
_heappush: Final = heapq.heappush
_heappop: Final = heapq.heappop


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


@dataclass
class DecodeNode:
    node_id: int
    engines: list[DecodeEngine]
    block_tokens: int
    steps_done: int = 0
    reserved_tokens: int = 0  # Σ of its engines' reserved_tokens: the group's Σ tok_e, O(1) per fetch
    joining: list[Request] = field(default_factory=list)
    run_steps: int = 0  # steps of the decode run in flight (`ClusterCore.start_decode_run`); 0: none
    # Calendar of next events (module NOTE): step -> [(id, request)], and a heap of those steps.
    _events: dict[int, list[tuple[int, Request]]] = field(default_factory=dict)
    _event_steps: list[int] = field(default_factory=list)
    _join_step: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (step, generated)
    _finish_heap: list[tuple[int, int]] = field(default_factory=list)  # (last-token step, id)

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
        return len(self._join_step)

    def merge_joiners(self) -> bool:
        """Joiners enter the running batch at a step boundary; True if anything is running."""
        for request in self.joining:
            assert request.de_engine is not None
            e = self.engine(request.de_engine)
            e.running += 1
            e.ctx_base += request.kv_tokens - self.steps_done
            self._join_step[request.request_id] = (self.steps_done, request.generated_tokens)
            self._add_event(self._next_event_step(request), request)
            last = self.steps_done + max(1, request.gen_tokens - request.generated_tokens)
            _heappush(self._finish_heap, (last, request.request_id))
        self.joining.clear()
        return bool(self._join_step)

    def batch_ids(self) -> tuple[int, ...]:
        """Ids of the running requests, in the order they merged."""
        return tuple(self._join_step)

    def shape(self) -> tuple[tuple[int, int], ...]:
        """Per engine (batch size, Σ context tokens) for the cost of the next step."""
        return tuple((e.running, e.ctx_base + e.running * self.steps_done) for e in self.engines)

    def steps_to_next_event(self) -> int:
        """Steps until the next token of interest of any request (inspection: the calendar's head)."""
        return max(1, self._event_steps[0] - self.steps_done) if self._event_steps else 0

    def steps_to_next_batch_change(self) -> int:
        """Steps until a request's last token (the batch shrinks); 0 when nothing runs.

        Second tokens and filled blocks do not change the batch: a driver may run past them and
        process them late (`DecodeEvent.step` says when they happened).
        """
        return max(1, self._finish_heap[0][0] - self.steps_done) if self._finish_heap else 0

    def advance(self, steps: int) -> list[DecodeEvent]:
        self.steps_done += steps
        events: list[DecodeEvent] = []
        event_steps, calendar = self._event_steps, self._events
        while event_steps and event_steps[0] <= self.steps_done:
            step = _heappop(event_steps)
            due = calendar.pop(step)
            if len(due) > 1:
                due.sort()  # by request id (ids are unique, so requests are never compared)
            for _, request in due:
                events.append(self._process(request, step))
        finish = self._finish_heap
        while finish and finish[0][0] <= self.steps_done:
            _heappop(finish)
        return events

    def shorten(self, request: Request) -> None:
        """`request.gen_tokens` fell (`ClusterCore.finish_early`): if it runs here, its last token is now at
        step join + (gen_tokens - generated at join), maybe before its next event or even before now
        (its decode node stopped it inside the run just done): its next event moves there, so that the
        next `advance` finishes it with exactly gen_tokens tokens."""
        joined = self._join_step.get(request.request_id)
        if joined is None:  # not in the batch yet: `merge_joiners` reads the new gen_tokens
            return
        join_step, gen_at_join = joined
        last = join_step + max(0, request.gen_tokens - gen_at_join)
        for step, due in self._events.items():
            index = next((i for i, (rid, _) in enumerate(due) if rid == request.request_id), None)
            if index is None:
                continue
            if step > last:
                del due[index]
                if not due:
                    del self._events[step]
                    self._event_steps.remove(step)
                    heapq.heapify(self._event_steps)
                self._add_event(last, request)
            break
        _heappush(self._finish_heap, (last, request.request_id))

    def _process(self, request: Request, step: int) -> DecodeEvent:
        join_step, gen_at_join = self._join_step[request.request_id]
        before = request.generated_tokens
        generated = gen_at_join + self.steps_done - join_step
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
            del self._join_step[request.request_id]
            e.running -= 1
            e.ctx_base -= request.prompt_tokens + max(0, gen_at_join - 1) - join_step  # its share at merge
        else:
            self._add_event(self._next_event_step(request), request)
        return DecodeEvent(
            request=request,
            step=step,
            second_token=before < 2 <= request.generated_tokens,
            persist_tokens=persist,
            persisted_tokens=request.persisted_tokens,
            finished=finished,
        )

    def _add_event(self, step: int, request: Request) -> None:
        due = self._events.get(step)
        if due is None:
            self._events[step] = [(request.request_id, request)]
            _heappush(self._event_steps, step)
        else:
            due.append((request.request_id, request))

    def _next_event_step(self, request: Request) -> int:
        """Absolute step of the request's next second-token / block-full / last-token event."""
        g = request.generated_tokens
        until_last = request.gen_tokens - g
        until_block = request.persisted_tokens + self.block_tokens - request.kv_tokens
        until = 1 if g < 2 else min(until_last, until_block)
        return self.steps_done + max(1, until)

    def check_invariants(self) -> None:
        assert sum(e.running for e in self.engines) == len(self._join_step)
        assert sorted(self._event_steps) == sorted(self._events)
        assert sum(map(len, self._events.values())) == len(self._join_step)  # one next event per request
        for e in self.engines:
            assert 0 <= e.reserved_tokens <= max(e.hbm_tokens, e.reserved_tokens)
        assert self.reserved_tokens == sum(e.reserved_tokens for e in self.engines)
