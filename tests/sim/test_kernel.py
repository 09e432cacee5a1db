"""Event kernel: ordering by (time, priority, seq), lazy cancellation, run limits, determinism."""

from __future__ import annotations

import random

import pytest

from dualpath.sim.kernel import Simulator


def test_events_run_in_time_then_priority_then_fifo_order() -> None:
    sim = Simulator()
    log: list[str] = []
    sim.schedule(2.0, log.append, "t2")
    sim.schedule(1.0, log.append, "t1-p5", priority=5)
    sim.schedule(1.0, log.append, "t1-p0-first")
    sim.schedule(1.0, log.append, "t1-p0-second")
    sim.schedule(1.0, log.append, "t1-pneg", priority=-1)
    sim.run()
    assert log == ["t1-pneg", "t1-p0-first", "t1-p0-second", "t1-p5", "t2"]
    assert sim.now_s == 2.0
    assert sim.events_processed == 5


def test_a_deep_heap_pops_in_key_order_while_events_keep_arriving() -> None:
    """Thousands of entries with repeated times and priorities, pushed while others pop: the run order is
    the sorted (time, priority, scheduling order) of all of them (each arrives later than now)."""
    rng = random.Random(7)
    sim = Simulator()
    ran: list[tuple[float, int, int]] = []
    keys: list[tuple[float, int, int]] = []
    order = 0

    def push(time_s: float, priority: int) -> None:
        nonlocal order
        order += 1
        keys.append((time_s, priority, order))
        sim.schedule_at(time_s, ev, (time_s, priority, order), priority=priority)

    def ev(key: tuple[float, int, int]) -> None:
        ran.append(key)
        if len(keys) < 6000:  # a new arrival for about every event run: the heap stays deep
            push(sim.now_s + rng.randrange(1, 40) / 8.0, rng.randrange(-2, 3))  # later than now

    for _ in range(3000):
        push(rng.randrange(0, 40) / 8.0, rng.randrange(-2, 3))
    sim.run()
    assert len(ran) == len(keys) == 6000
    assert ran == sorted(keys)


def test_callbacks_see_their_own_time_and_can_schedule_more() -> None:
    sim = Simulator()
    seen: list[float] = []

    def tick(n: int) -> None:
        seen.append(sim.now_s)
        if n:
            sim.schedule(0.5, tick, n - 1)

    sim.schedule_at(1.0, tick, 3)
    sim.run()
    assert seen == [1.0, 1.5, 2.0, 2.5]


def test_instant_end_callbacks_run_after_the_instant_in_request_order() -> None:
    """`at_instant_end`: after every event of the instant, in request order, one round at a time; a
    callback asked for during a round runs after the events the round scheduled at this instant."""
    sim = Simulator()
    log: list[str] = []

    def end(name: str, then: str | None = None) -> None:
        log.append(f"end {name}@{sim.now_s}")
        if then == "event":  # an event at this instant: it runs before the next round
            sim.schedule(0.0, event, f"{name}'s event")
        elif then == "end":  # another callback: the next round
            sim.at_instant_end(lambda: end(f"{name}'s end"))

    def event(name: str) -> None:
        log.append(f"{name}@{sim.now_s}")
        if name == "a":
            sim.at_instant_end(lambda: end("first", "event"))
            sim.at_instant_end(lambda: end("second", "end"))
            sim.at_instant_end(lambda: end("third"))
            assert sim.next_time_s() == sim.now_s  # pending callbacks: the instant is not over
        if name == "first's event":
            sim.at_instant_end(lambda: end("after the event"))

    sim.schedule_at(1.0, event, "a")
    sim.schedule_at(1.0, event, "b")
    sim.schedule_at(2.0, event, "c")
    sim.run()
    assert log == [
        "a@1.0",
        "b@1.0",
        "end first@1.0",
        "end second@1.0",
        "end third@1.0",
        "first's event@1.0",
        "end second's end@1.0",
        "end after the event@1.0",
        "c@2.0",
    ]
    assert sim.events_processed == 4  # instant-end callbacks are not events


def test_cancel_is_lazy_and_idempotent() -> None:
    sim = Simulator()
    log: list[int] = []
    handle = sim.schedule(1.0, log.append, 1)
    sim.schedule(2.0, log.append, 2)
    sim.cancel(handle)
    sim.cancel(handle)
    assert sim.next_time_s() == 2.0
    sim.run()
    assert log == [2]
    assert sim.events_processed == 1
    sim.cancel(handle)  # after the fact: still a no-op


def test_cancelling_a_fired_event_is_a_noop() -> None:
    sim = Simulator()
    log: list[int] = []
    handle = sim.schedule(1.0, log.append, 1)
    sim.run()
    sim.cancel(handle)
    assert log == [1]


def test_run_until_is_exclusive_and_advances_the_clock() -> None:
    sim = Simulator()
    log: list[float] = []
    for t in (1.0, 2.0, 3.0):
        sim.schedule_at(t, log.append, t)
    assert sim.run(until_s=2.0) == 1
    assert log == [1.0] and sim.now_s == 2.0
    assert sim.run(until_s=10.0) == 2
    assert sim.now_s == 10.0


def test_run_max_events_and_stop() -> None:
    sim = Simulator()
    log: list[int] = []
    for i in range(5):
        sim.schedule(float(i), log.append, i)
    assert sim.run(max_events=2) == 2
    assert log == [0, 1]
    sim.schedule(2.5, sim.stop)  # relative to now 1.0 -> 3.5
    sim.run()
    assert log == [0, 1, 2, 3]
    assert sim.now_s == 3.5


def test_scheduling_in_the_past_is_an_error() -> None:
    sim = Simulator()
    sim.schedule(1.0, lambda: None)
    sim.run()
    with pytest.raises(ValueError):
        sim.schedule(-0.1, lambda: None)
    with pytest.raises(ValueError):
        sim.schedule_at(0.5, lambda: None)


def test_progress_callback_fires_every_n_events() -> None:
    sim = Simulator()
    counts: list[int] = []
    sim.set_progress(lambda s: counts.append(s.events_processed), every_events=3)
    for i in range(10):
        sim.schedule(float(i), lambda: None)
    sim.run()
    assert counts == [3, 6, 9]


def test_same_inputs_give_identical_event_order() -> None:
    def trace() -> list[tuple[float, int]]:
        sim = Simulator()
        out: list[tuple[float, int]] = []

        def ev(i: int) -> None:
            out.append((sim.now_s, i))
            if i < 200:
                sim.schedule((i * 7919 % 13) / 10.0, ev, i + 13)

        for i in range(13):
            sim.schedule(0.0, ev, i, priority=i % 3)
        sim.run()
        return out

    assert trace() == trace()
    assert len(trace()) > 100


def _cancel_heavy_trace(sim: Simulator) -> list[tuple[float, int]]:
    """Events that keep re-scheduling a sibling (cancel + push, as the link network does), with
    equal times and priorities so that any reordering of ties would show."""
    out: list[tuple[float, int]] = []
    handles: dict[int, list[object]] = {}

    def ev(i: int) -> None:
        out.append((sim.now_s, i))
        if len(out) > 3000:
            return
        for k in range(1, 6):  # a rate change moves several groups' completion events
            sibling = (i * 7 + k * 11) % 50
            if sibling == i:
                continue
            old = handles.get(sibling)
            if old is not None:
                sim.cancel(old)
            handles[sibling] = sim.schedule(((i + k) * 31 % 5) / 4.0, ev, sibling, priority=k % 2)
        handles[i] = sim.schedule(((i * 31) % 5) / 4.0 + 0.25, ev, i, priority=i % 2)

    for i in range(50):
        handles[i] = sim.schedule((i % 4) / 4.0, ev, i, priority=i % 3)
    sim.run()
    return out


def test_compaction_drops_only_cancelled_entries_and_keeps_the_order() -> None:
    sim = Simulator()
    log: list[int] = []
    handles = [sim.schedule(float(i % 17), log.append, i) for i in range(2000)]
    for h in handles[::3]:
        sim.cancel(h)
    for h in handles[1::3]:
        sim.cancel(h)
    # Cancelling a quarter of the live ones again must count each entry once.
    for h in handles[::3]:
        sim.cancel(h)
    assert sim.pending_entries() - sim.cancelled_entries() == len(handles[2::3])
    assert sim.pending_entries() < len(handles)  # compacted at least once
    sim.run()
    expected = sorted(range(2, 2000, 3), key=lambda i: (i % 17, i))
    assert log == expected
    assert sim.cancelled_entries() == 0 and sim.pending_entries() == 0


def test_compaction_gives_the_same_event_order_as_never_compacting(monkeypatch: pytest.MonkeyPatch) -> None:
    import dualpath.sim.kernel as kernel

    compacted = _cancel_heavy_trace(Simulator())
    if not kernel.__file__.endswith(".py"):
        pytest.skip("the native build fixes COMPACT_MIN_DEAD at compile time")
    monkeypatch.setattr(kernel, "COMPACT_MIN_DEAD", 10**9)
    assert _cancel_heavy_trace(Simulator()) == compacted
    assert len(compacted) > 3000


def test_cancelled_count_stays_exact_through_pops_and_next_time() -> None:
    sim = Simulator()
    handles = [sim.schedule(float(i), lambda: None) for i in range(10)]
    for h in handles[:4]:
        sim.cancel(h)
    assert sim.cancelled_entries() == 4
    assert sim.next_time_s() == 4.0  # pops the four cancelled entries at the top
    assert sim.cancelled_entries() == 0
    sim.cancel(handles[6])
    sim.run(until_s=8.0)
    assert sim.cancelled_entries() == 0
    sim.run()
    sim.cancel(handles[9])  # already ran
    assert sim.cancelled_entries() == 0


def _moving_trace(sim: Simulator, use_move: bool) -> list[tuple[float, int]]:
    """Random reschedules (the link network's at every rate change), cancels and new events with many
    equal times and priorities; each event either moved in place or cancelled and scheduled again."""
    rng = random.Random(3)
    out: list[tuple[float, int]] = []
    handles: dict[int, object] = {}

    def ev(i: int) -> None:
        out.append((sim.now_s, i))
        del handles[i]
        if len(out) > 4000:
            return
        for _ in range(rng.randrange(1, 6)):
            j = rng.randrange(60)
            delay_s = rng.randrange(0, 8) / 4.0
            handle = handles.get(j)
            if handle is None:
                handles[j] = sim.schedule(delay_s, ev, j, priority=j % 3)
            elif rng.random() < 0.2:
                sim.cancel(handle)
                del handles[j]
            elif use_move:
                sim.move(handle, delay_s)
            else:
                sim.cancel(handle)
                handles[j] = sim.schedule(delay_s, ev, j, priority=j % 3)

    for i in range(60):
        handles[i] = sim.schedule((i % 5) / 4.0, ev, i, priority=i % 3)
    sim.run()
    return out


def test_moving_an_event_orders_it_as_cancelling_and_scheduling_it_again() -> None:
    moved = _moving_trace(Simulator(), use_move=True)
    assert moved == _moving_trace(Simulator(), use_move=False)
    assert len(moved) > 4000 and len({t for t, _ in moved}) < len(moved) // 4  # many ties


def test_moving_a_fired_or_cancelled_event_is_an_error() -> None:
    sim = Simulator()
    fired = sim.schedule(1.0, lambda: None)
    cancelled = sim.schedule(2.0, lambda: None)
    sim.cancel(cancelled)
    sim.run(until_s=1.5)
    for handle in (fired, cancelled):
        with pytest.raises(ValueError, match="ran or was cancelled"):
            sim.move(handle, 1.0)
    pending = sim.schedule(1.0, lambda: None)
    with pytest.raises(ValueError, match="past"):
        sim.move(pending, -0.5)


def test_one_argument_events_take_their_place_in_the_same_order() -> None:
    # `schedule_one` / `schedule_one_at` are `schedule(delay, callback, arg)` without the tuple: the same
    # key (time, priority 0, scheduling order) among the others, the argument passed as is, cancel and
    # move as for any entry.
    sim = Simulator()
    log: list[object] = []
    sim.schedule(1.0, log.append, "tuple-first")
    sim.schedule_one(1.0, log.append, "one-second")
    sim.schedule_one_at(0.5, log.append, ("a", "tuple", "as", "one", "argument"))
    sim.schedule(1.0, log.append, "tuple-third")
    dropped = sim.schedule_one(0.7, log.append, "cancelled")
    moved = sim.schedule_one(0.2, log.append, "moved-after-third")
    sim.schedule(1.0, log.append, "p-1", priority=-1)
    assert moved.arguments == ("moved-after-third",) and dropped.args is None
    sim.cancel(dropped)
    sim.move(moved, 1.0)
    sim.run()
    assert log == [
        ("a", "tuple", "as", "one", "argument"),
        "p-1",
        "tuple-first",
        "one-second",
        "tuple-third",
        "moved-after-third",
    ]
    assert sim.events_processed == 6


def test_one_argument_events_in_the_past_are_an_error() -> None:
    sim = Simulator(start_s=5.0)
    with pytest.raises(ValueError, match="past"):
        sim.schedule_one(-1.0, print, "x")
    with pytest.raises(ValueError, match="now is"):
        sim.schedule_one_at(4.0, print, "x")
