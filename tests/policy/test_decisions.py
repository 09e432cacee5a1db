"""Decisions compare by value: two drivers' logs are equal when they decided the same things."""

from __future__ import annotations

from dualpath.policy.batching import BatchItem
from dualpath.policy.decisions import Assignment, BatchDecision, DecisionLog
from dualpath.policy.types import NodeReadState, ReadPlan, ReadSide


def _assignment(**changes: int) -> Assignment:
    fields = dict(request_id=7, pe_engine=1, de_engine=9, pe_read_tokens=64, de_read_tokens=0) | changes
    return Assignment(**fields)


def test_assignments_are_equal_by_every_field() -> None:
    a = _assignment()
    assert a == _assignment() and hash(a) == hash(_assignment())
    for field in ("request_id", "pe_engine", "de_engine", "pe_read_tokens", "de_read_tokens"):
        assert a != _assignment(**{field: 3}), field
    assert a != BatchDecision(pe_engine=1, items=())
    assert (
        repr(a) == "Assignment(request_id=7, pe_engine=1, de_engine=9, pe_read_tokens=64, de_read_tokens=0)"
    )
    assert a.side is ReadSide.PE and _assignment(pe_read_tokens=0, de_read_tokens=64).side is ReadSide.DE


def test_batch_decisions_and_logs_compare_by_value() -> None:
    def items() -> tuple[BatchItem, ...]:  # fresh records each time: equal by value, not by identity
        return (BatchItem(request_id=7, cached_tokens=64, new_tokens=16),)

    b = BatchDecision(pe_engine=2, items=items())
    assert b == BatchDecision(pe_engine=2, items=items()) and hash(b) == hash(
        BatchDecision(pe_engine=2, items=items())
    )
    assert b != BatchDecision(pe_engine=3, items=items())
    assert b != BatchDecision(pe_engine=2, items=(BatchItem(request_id=7, cached_tokens=64, new_tokens=8),))
    one, two = DecisionLog(), DecisionLog()
    for log in (one, two):
        log.record(_assignment())
        log.record(BatchDecision(pe_engine=2, items=items()))
    assert one.per_engine() == two.per_engine()
    two.record(_assignment(request_id=8))
    assert one.per_engine() != two.per_engine()


def test_read_states_and_plans_compare_by_value() -> None:
    assert NodeReadState(10, 2.0) == NodeReadState(read_q_tokens=10, read_tokens_per_s=2.0)
    assert NodeReadState(10, 2.0) != NodeReadState(11, 2.0)
    assert NodeReadState(10, 2.0) != NodeReadState(10, 3.0)
    assert len({ReadPlan(64, 0), ReadPlan(pe_read_tokens=64, de_read_tokens=0), ReadPlan(0, 64)}) == 2
    assert ReadPlan(64, 0) != (64, 0)  # a record, not a tuple
    assert repr(ReadPlan(0, 64)) == "ReadPlan(pe_read_tokens=0, de_read_tokens=64)"
    assert ReadPlan(0, 64).side is ReadSide.DE


def test_read_tokens_sum_the_assignments_hits_by_side() -> None:
    log = DecisionLog()
    assert log.read_tokens() == (0, 0)
    log.record(_assignment(pe_read_tokens=64, de_read_tokens=0))
    log.record(BatchDecision(pe_engine=2, items=(BatchItem(request_id=7, cached_tokens=640, new_tokens=16),)))
    log.record(_assignment(request_id=8, pe_read_tokens=128, de_read_tokens=256))
    assert log.read_tokens() == (192, 256)
    log.take_unread(keep=False)  # a driver that keeps nothing: the sums stay whole
    log.record(_assignment(request_id=9, pe_read_tokens=0, de_read_tokens=8))
    assert log.read_tokens() == (192, 264)


def test_take_unread_hands_each_decision_out_once_kept_or_dropped() -> None:
    log = DecisionLog()
    first, second, third = (_assignment(request_id=i) for i in (1, 2, 3))
    log.record(first)
    log.record(second)
    assert log.take_unread(keep=True) == [first, second] and log.entries == [first, second]
    assert log.take_unread(keep=True) == []
    log.record(third)
    assert log.take_unread(keep=True) == [third] and log.entries == [first, second, third]
    log.record(first)
    assert log.take_unread(keep=False) == [first] and log.entries == []
    log.record(second)
    assert log.take_unread(keep=False) == [second] and log.entries == []
