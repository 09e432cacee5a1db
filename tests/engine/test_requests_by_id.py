"""`RequestsById`, the core's table of live requests: what a dict by id gives, for increasing ids."""

from __future__ import annotations

import random

import pytest

from dualpath.request import Request, RequestsById


def _request(rid: int) -> Request:
    return Request(request_id=rid, trajectory_id=0, round_index=0, prompt_tokens=64, hit_tokens=0,
                   gen_tokens=1, arrival_s=0.0)  # fmt: skip


@pytest.mark.parametrize("seed", range(5))
def test_the_table_answers_as_a_dict_does(seed: int) -> None:
    # Random adds (increasing ids, some never given), pops and lookups, enough for many trims.
    rng = random.Random(seed)
    table, model = RequestsById(), dict[int, Request]()
    next_id = 0
    for _ in range(20_000):
        op = rng.random()
        if op < 0.4:
            next_id += rng.choice((1, 1, 1, 2, 7))
            request = _request(next_id)
            table.add(request)
            model[next_id] = request
        elif op < 0.8 and model:
            # Mostly the oldest (requests finish roughly in order), sometimes any, sometimes one gone.
            rid = min(model) if rng.random() < 0.5 else rng.choice([*model, next_id + 3, -1])
            assert table.pop(rid) is model.pop(rid, None)
        else:
            rid = rng.randrange(-2, next_id + 3)
            assert table.get(rid) is model.get(rid)
        assert len(table) == len(model)
    assert table.values() == list(model.values())
    for rid in range(next_id + 2):
        assert table.get(rid) is model.get(rid)


def test_the_list_spans_the_live_ids_only() -> None:
    table = RequestsById()
    for rid in range(100_000):
        table.add(_request(rid))
        if rid >= 10:
            table.pop(rid - 10)
    assert len(table) == 10 and [r.request_id for r in table.values()] == list(range(99_990, 100_000))
    assert table.capacity < 3 * 1024  # the slots of the gone ids left the front


def test_ids_must_increase_and_a_missing_id_is_a_key_error() -> None:
    table = RequestsById()
    table.add(_request(5))
    with pytest.raises(ValueError, match="ids must increase"):
        table.add(_request(5))
    with pytest.raises(ValueError, match="ids must increase"):
        table.add(_request(3))
    assert table.at(5).request_id == 5
    with pytest.raises(KeyError):
        table.at(4)
