"""A DE node's wheel of next events: events by (step, request id), runs of any length alike, early finishes."""

from __future__ import annotations

import random

from dualpath.engine.decode import DecodeEngine, DecodeEvent, DecodeNode
from dualpath.request import Request

BLOCK_TOKENS = 16


def _node() -> DecodeNode:
    return DecodeNode(0, [DecodeEngine(e, 0, 10**9) for e in range(3)], block_tokens=BLOCK_TOKENS)


def _request(rng: random.Random, request_id: int) -> Request:
    prompt = rng.randint(1, 70)
    return Request(request_id=request_id, trajectory_id=0, round_index=0, prompt_tokens=prompt, hit_tokens=0,
                   gen_tokens=rng.randint(1, 60), arrival_s=0.0, de_engine=rng.randrange(3), generated_tokens=1,
                   persisted_tokens=prompt // BLOCK_TOKENS * BLOCK_TOKENS)  # fmt: skip


def _key(ev: DecodeEvent) -> tuple[int, int, bool, int, int, bool]:
    return (
        ev.step,
        ev.request.request_id,
        ev.second_token,
        ev.persist_tokens,
        ev.persisted_tokens,
        ev.finished,
    )


def _replay(seed: int, run_steps: list[int]) -> tuple[list[tuple[int, ...]], list[Request]]:
    """40 requests (ids shuffled) join at step 0; the node advances in runs of the given lengths, each cut at
    the next batch change as `ClusterCore.start_decode_run` does. Every event in the order it came out,
    with the step the run ended at."""
    rng = random.Random(seed)
    ids = list(range(1, 41))
    rng.shuffle(ids)
    requests = [_request(rng, i) for i in ids]
    node = _node()
    node.joining.extend(requests)
    node.merge_joiners()
    out = []
    runs = iter(run_steps * 10_000)
    while node.num_running:
        events = node.advance(min(next(runs), node.steps_to_next_batch_change()))
        assert [(e.step, e.request.request_id) for e in events] == sorted(
            (e.step, e.request.request_id) for e in events
        )
        out += [(*_key(e), node.steps_done) for e in events]
        node.check_invariants()
    return out, requests


def test_step_by_step_each_request_has_its_own_events() -> None:
    """Second token one step after joining, a persist at each filled block, the last token at gen_tokens."""
    events, requests = _replay(0, [1])
    for r in requests:
        mine = [k for k in events if k[1] == r.request_id]
        gen = r.gen_tokens
        assert [k[0] for k in mine if k[5]] == [gen - 1]  # joined with 1 token: one more per step
        assert [k[0] for k in mine if k[2]] == ([1] if gen >= 2 else [])
        # A block fills when kv = prompt + g - 1 = prompt + step reaches a multiple of the block size.
        blocks = [s for s in range(1, gen) if (r.prompt_tokens + s) % BLOCK_TOKENS == 0]
        assert [k[0] for k in mine if k[3]] == blocks
        assert r.generated_tokens == gen
        assert r.persisted_tokens == (r.prompt_tokens + gen - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def test_runs_of_any_length_end_every_request_at_the_same_step() -> None:
    for seed in range(4):
        one_step, _ = _replay(seed, [1])
        for runs in ([7, 1, 3], [10**6]):
            events, requests = _replay(seed, runs)
            # Second tokens at the same steps; last tokens out when the same run ends (a late event that
            # also finishes its request keeps its own, earlier `step`).
            assert sorted((k[1], k[0]) for k in events if k[2]) == sorted(
                (k[1], k[0]) for k in one_step if k[2]
            )
            assert sorted((k[1], k[6]) for k in events if k[5]) == sorted(
                (k[1], k[6]) for k in one_step if k[5]
            )
            assert all(r.generated_tokens == r.gen_tokens for r in requests)


def _two_joined(a_id: int, b_id: int) -> tuple[DecodeNode, Request, Request]:
    """Two requests of 20 prompt tokens (16 stored) and 50 output tokens, joined at step 0."""
    node = _node()
    a, b = (
        Request(request_id=rid, trajectory_id=0, round_index=0, prompt_tokens=20, hit_tokens=0, gen_tokens=50,
                arrival_s=0.0, de_engine=engine, generated_tokens=1, persisted_tokens=16)  # fmt: skip
        for rid, engine in ((a_id, 0), (b_id, 1))
    )  # fmt: skip
    node.joining += [a, b]
    node.merge_joiners()
    return node, a, b


def test_a_shortened_request_finishes_with_exactly_its_new_output() -> None:
    node, a, b = _two_joined(5, 3)
    node.advance(5)  # second tokens out; next events at the filled blocks (step 13)
    a.gen_tokens = 8
    node.shorten(a)  # its last token moves before its next event: at join + 7 = step 7
    node.check_invariants()
    assert node.steps_to_next_batch_change() == 2
    events = node.advance(2)
    assert [(e.request.request_id, e.step, e.finished) for e in events] == [(5, 7, True)]
    assert a.generated_tokens == 8 and node.num_running == 1
    # The stale last-token entry of `a` (step 49) only ends a run early; `b` runs on to its own end.
    b_end: list[DecodeEvent] = []
    while not b_end:
        b_end = [e for e in node.advance(node.steps_to_next_batch_change()) if e.finished]
    assert b_end[0].request is b and b.generated_tokens == 50 and node.num_running == 0
    node.check_invariants()


def test_a_request_shortened_to_a_step_already_run_comes_out_first_at_that_step() -> None:
    """Its node stopped it inside the run just done: the next run's first event is its last token, with
    the step it came at, before the events of the steps that run covers; shortened twice, the second
    step holds."""
    node, a, b = _two_joined(9, 2)
    node.advance(10)  # second tokens out; both next at their block filling: kv = 20 + g - 1 = 32 at step 12
    a.gen_tokens = 10
    node.shorten(a)  # its last token at join + 9 = step 9, already run
    node.check_invariants()
    a.gen_tokens = 6
    node.shorten(a)  # again, earlier still: step 5
    node.check_invariants()
    assert node.steps_to_next_event() == 1
    events = node.advance(2)
    assert [(e.request.request_id, e.step, e.finished) for e in events] == [(9, 5, True), (2, 12, False)]
    assert a.generated_tokens == 6 and b.persisted_tokens == 32
    node.check_invariants()


def test_a_record_further_ahead_than_the_wheel_spans_widens_it_and_keeps_the_order() -> None:
    """A request whose stored prefix runs ahead of its tokens (its next block fills far ahead) widens the
    wheel; the others' events stay at their steps, in (step, id) order."""
    rng = random.Random(3)
    node = _node()
    requests = [_request(rng, i) for i in range(1, 11)]
    node.joining += requests
    node.merge_joiners()
    node.advance(1)
    far = Request(request_id=99, trajectory_id=0, round_index=0, prompt_tokens=20, hit_tokens=0,
                  gen_tokens=500, arrival_s=0.0, de_engine=2, generated_tokens=5,
                  persisted_tokens=20 + 4 * BLOCK_TOKENS)  # fmt: skip
    node.joining.append(far)
    node.merge_joiners()  # next event: its block filling, 76 steps ahead (the wheel spans 16 + 1)
    node.check_invariants()
    out: list[tuple[int, int]] = []
    while node.num_running:
        events = node.advance(1)
        out += [(e.step, e.request.request_id) for e in events]
        node.check_invariants()
    assert out == sorted(out)
    far_steps = [s for s, rid in out if rid == 99]
    # kv = 20 + g - 1 reaches 84 + 16 at g = 81, 76 steps after it joined at step 1; then 112 at step 89.
    assert far_steps[:2] == [77, 89]


def test_the_batch_keeps_its_merge_order_as_requests_finish_and_join() -> None:
    """`batch_ids` is the running requests in the order they merged, through hundreds of finishes (the
    finished records leave the node's list in batches) and later joiners; a shortened request is found."""
    rng = random.Random(7)
    node = _node()
    merged: list[Request] = []  # the reference: merge order
    next_id = 1
    for wave in range(12):
        joiners = [_request(rng, next_id + k) for k in range(rng.randint(10, 40))]
        next_id += len(joiners)
        rng.shuffle(joiners)
        node.joining.extend(joiners)
        node.merge_joiners()
        merged += joiners
        if wave == 6:  # shorten a request still running, after some finished records have left the list
            victim = next(r for r in merged if r.generated_tokens < r.gen_tokens - 2)
            victim.gen_tokens = victim.generated_tokens + 1
            node.shorten(victim)
        for _ in range(rng.randint(5, 30)):
            if not node.num_running:
                break
            node.advance(min(rng.randint(1, 9), node.steps_to_next_batch_change()))
            running = [r.request_id for r in merged if r.generated_tokens < r.gen_tokens]
            assert node.batch_ids() == tuple(running)
            assert node.num_running == len(running)
            node.check_invariants()
    while node.num_running:
        node.advance(node.steps_to_next_batch_change())
    assert node.batch_ids() == () and all(r.generated_tokens == r.gen_tokens for r in merged)
    assert len(merged) >= 200  # enough finishes for the list to drop its finished records more than once
