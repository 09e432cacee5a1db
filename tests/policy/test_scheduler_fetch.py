"""A DE group's fetch that cannot place anything is skipped until something it depends on changes."""

from __future__ import annotations

import pytest

from dualpath.config.specs import SchedulerSpec
from dualpath.policy.read_path import make_read_path_policy
from dualpath.policy.scheduler import RequestScheduler
from dualpath.policy.types import EngineLoad
from dualpath.request import Request


def test_de_group_settles_until_freed_or_routed() -> None:
    s = RequestScheduler(pe_nodes={0: [0]}, de_nodes={1: [1]}, spec=SchedulerSpec(),
                         read_path=make_read_path_policy("shorter-queue"), read_tokens_per_s={0: 1e6, 1: 1e6},
                         alpha_tokens=1e6, beta_tokens=1e6)  # fmt: skip
    big = Request(request_id=0, trajectory_id=0, round_index=0, prompt_tokens=900, hit_tokens=0,
                  gen_tokens=200, arrival_s=0.0)  # fmt: skip
    s.submit(big)
    assert s.has_de_work(1, 0)  # the global queue has something to route, whatever the DEs' room
    full = [
        EngineLoad(
            engine_id=1, node_id=1, seq=3, tok=5000, compute_tok=0, read_q_tokens=0, free_hbm_tokens=100
        )
    ]
    assert s.fetch_de_group(1, full) == []  # does not fit
    assert not s.has_de_work(1, 5000)  # the same fetch would stop at the same head
    s.note_de_freed(1)
    assert s.has_de_work(1, 1100)  # len_r = 1,100 fits the freed DE
    assert not s.has_de_work(1, 1099)  # no DE has room for the head: phase 2 would stop there at once
    s.note_de_group(1, read_q_tokens=0, tok=5000)  # the report such a fetch would have made
    assert not s.has_de_work(1, 1100)  # settled again until a DE frees
    s.note_de_freed(1)
    roomy = [
        EngineLoad(
            engine_id=1, node_id=1, seq=2, tok=3000, compute_tok=0, read_q_tokens=0, free_hbm_tokens=5000
        )
    ]
    assert [r.request_id for r, _ in s.fetch_de_group(1, roomy)] == [0]
    assert not s.has_de_work(1, 5000)
    s.submit(Request(request_id=1, trajectory_id=1, round_index=0, prompt_tokens=10, hit_tokens=0,
                     gen_tokens=1, arrival_s=0.0))  # fmt: skip
    assert s.has_de_work(1, 0)  # the global queue has something to route


def _de_load(engine: int, node: int, free: int) -> EngineLoad:
    return EngineLoad(engine_id=engine, node_id=node, seq=0, tok=0, compute_tok=0, read_q_tokens=0,
                      free_hbm_tokens=free)  # fmt: skip


def test_round_robin_fetch_of_a_full_sole_de_group_ends_and_keeps_the_cycle() -> None:
    """One DE group holds every DE of the cycle: a head no DE has room for ends the fetch after one
    cycle of lost turns (the cycle never reaches another group), where the next fetch resumes it."""
    s = RequestScheduler(pe_nodes={0: [0]}, de_nodes={1: [1, 2, 3]}, spec=SchedulerSpec(),
                         read_path=make_read_path_policy("pe-read"), read_tokens_per_s={0: 1e6, 1: 1e6},
                         alpha_tokens=1e6, beta_tokens=1e6, scheduling="round-robin")  # fmt: skip
    for rid in range(3):
        s.submit(Request(request_id=rid, trajectory_id=rid, round_index=0, prompt_tokens=90, hit_tokens=0,
                         gen_tokens=10, arrival_s=0.0))  # fmt: skip
    # Engine 1 fits one request, engine 2 none, engine 3 one: two placed, the third fits nowhere.
    placed = s.fetch_de_group(1, [_de_load(1, 1, 150), _de_load(2, 1, 50), _de_load(3, 1, 100)])
    assert [(r.request_id, e) for r, e in placed] == [(0, 1), (1, 3)]
    assert s.global_queue_len == 1
    assert not s.has_de_work(1, 0)  # every DE lost its turn to this head: nothing to place until one frees
    assert s.fetch_de_group(1, [_de_load(1, 1, 50), _de_load(2, 1, 50), _de_load(3, 1, 0)]) == []
    s.note_de_freed(1)
    assert s.has_de_work(1, 0)
    # The turn after engine 3's is engine 1's, whatever cycles of lost turns came between.
    placed = s.fetch_de_group(1, [_de_load(1, 1, 100), _de_load(2, 1, 100), _de_load(3, 1, 100)])
    assert [(r.request_id, e) for r, e in placed] == [(2, 1)]


def test_round_robin_head_change_reopens_a_blocked_cycle() -> None:
    """Lost turns count against one head: a request submitted into an empty global queue is a new head."""
    s = RequestScheduler(pe_nodes={0: [0]}, de_nodes={1: [1], 2: [2]}, spec=SchedulerSpec(),
                         read_path=make_read_path_policy("pe-read"), read_tokens_per_s={0: 1e6, 1: 1e6, 2: 1e6},
                         alpha_tokens=1e6, beta_tokens=1e6, scheduling="round-robin")  # fmt: skip

    def submit(rid: int, prompt: int) -> None:
        s.submit(Request(request_id=rid, trajectory_id=rid, round_index=0, prompt_tokens=prompt, hit_tokens=0,
                         gen_tokens=10, arrival_s=0.0))  # fmt: skip

    submit(0, 90)  # needs 100 tokens of DE HBM
    assert s.fetch_de_group(1, [_de_load(1, 1, 99)]) == []  # engine 1 loses its turn, engine 2's is next
    assert s.has_de_work(2, 0)
    assert s.fetch_de_group(2, [_de_load(2, 2, 99)]) == []
    assert not s.has_de_work(1, 0) and not s.has_de_work(2, 0)  # a whole cycle lost to request 0
    submit(1, 10)  # behind the same head: still blocked
    assert not s.has_de_work(1, 0)
    placed = s.fetch_de_group(1, [_de_load(1, 1, 99)])  # a fetch anyway places nothing and keeps the turn
    assert placed == [] and s.global_queue_len == 2
    s.note_de_freed(2)
    assert [(r.request_id, e) for r, e in s.fetch_de_group(1, [_de_load(1, 1, 200)])] == [(0, 1)]
    assert [(r.request_id, e) for r, e in s.fetch_de_group(2, [_de_load(2, 2, 20)])] == [(1, 2)]
    assert not s.has_de_work(1, 0)  # the global queue is empty
    submit(2, 90)
    assert s.has_de_work(1, 0)


def test_a_fetch_sees_its_own_reports_not_the_last_fetch_candidates() -> None:
    """The scheduler keeps one candidate per engine and rewrites it from each fetch's reports: what the
    previous fetch did to them (placements) must not show through."""
    s = RequestScheduler(pe_nodes={0: [0, 1]}, de_nodes={1: [2, 3]}, spec=SchedulerSpec(),
                         read_path=make_read_path_policy("shorter-queue"), read_tokens_per_s={0: 1e6, 1: 1e6},
                         alpha_tokens=1e6, beta_tokens=1e6)  # fmt: skip

    def pe_load(engine: int, k: int) -> EngineLoad:
        return EngineLoad(engine_id=engine, node_id=0, seq=k, tok=10 * k + engine, compute_tok=5 * k + engine,
                          read_q_tokens=7 * k)  # fmt: skip

    def de_load(engine: int, k: int) -> EngineLoad:
        return EngineLoad(engine_id=engine, node_id=1, seq=k + engine, tok=20 * k + engine, compute_tok=0,
                          read_q_tokens=3 * k, free_hbm_tokens=1000 * k + engine)  # fmt: skip

    for k in (1, 2):
        pe = s._pe_candidates(0, [pe_load(0, k), pe_load(1, k)])
        assert [(c.engine_id, c.node_id, c.tok, c.compute_tok, c.read_q_tokens) for c in pe] == [
            (e, 0, 10 * k + e, 5 * k + e, 7 * k) for e in (0, 1)
        ]
        de = s._de_candidates(1, [de_load(2, k), de_load(3, k)])
        assert [(c.engine_id, c.node_id, c.seq, c.tok, c.free_hbm_tokens) for c in de] == [
            (e, 1, k + e, 20 * k + e, 1000 * k + e) for e in (2, 3)
        ]
        for c in pe:  # what a fetch does to its candidates
            c.tok, c.compute_tok, c.read_q_tokens = -1, -1, -1
        for d in de:
            d.seq, d.tok, d.free_hbm_tokens = -1, -1, -1


def test_ids_index_lists_so_they_must_be_non_negative() -> None:
    def make(pe: dict[int, list[int]], de: dict[int, list[int]]) -> RequestScheduler:
        rates = {n: 1e6 for n in (*pe, *de)}
        return RequestScheduler(pe_nodes=pe, de_nodes=de, spec=SchedulerSpec(),
                                read_path=make_read_path_policy("shorter-queue"), read_tokens_per_s=rates,
                                alpha_tokens=1e6, beta_tokens=1e6)  # fmt: skip

    s = make({0: [0, 1]}, {3: [6, 7]})  # sparse ids: the lists hold a slot for each id up to the largest
    assert [s.node_of(e) for e in (0, 1, 6, 7)] == [0, 0, 3, 3]
    for unknown in (2, 5, 8, -1):
        with pytest.raises(KeyError):
            s.node_of(unknown)
    with pytest.raises(ValueError, match="ids must be >= 0"):
        make({0: [0]}, {-1: [1]})
    with pytest.raises(ValueError, match=r"no read rate for nodes \[1\]"):
        RequestScheduler(pe_nodes={0: [0]}, de_nodes={1: [1]}, spec=SchedulerSpec(),
                         read_path=make_read_path_policy("shorter-queue"), read_tokens_per_s={0: 1e6},
                         alpha_tokens=1e6, beta_tokens=1e6)  # fmt: skip
