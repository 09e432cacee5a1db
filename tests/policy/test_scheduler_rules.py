"""One test per §6 rule of the scheduler (paper §6.1-§6.4)."""

from __future__ import annotations

import pytest

from dualpath.config.specs import SchedulerSpec
from dualpath.policy.batching import PrefillWork, pack_by_compute_quota, pack_by_token_budget
from dualpath.policy.de_assign import DeCandidate, GroupTokens, assign_within_de_group, route_to_de_groups
from dualpath.policy.fifo import fifo_of
from dualpath.policy.pe_assign import PeCandidate, assign_prefill_engines, choose_prefill_engine
from dualpath.policy.read_path import Split, make_read_path_policy
from dualpath.policy.scheduler import RequestScheduler
from dualpath.policy.traffic import TrafficClass, TransferKind, traffic_class
from dualpath.policy.types import EngineLoad, NodeReadState
from dualpath.request import Request


def make_request(rid: int, prompt: int = 1000, hit: int = 896, gen: int = 10) -> Request:
    return Request(request_id=rid, trajectory_id=rid, round_index=0, prompt_tokens=prompt, hit_tokens=hit,
                   gen_tokens=gen, arrival_s=0.0)  # fmt: skip


def pe(engine: int, tok: int, read_q: int, node: int = 0, compute_tok: int | None = None) -> PeCandidate:
    """A PE candidate; its requests are all misses (compute_tok = tok) unless told otherwise."""
    compute = tok if compute_tok is None else compute_tok
    return PeCandidate(engine_id=engine, node_id=node, tok=tok, compute_tok=compute, read_q_tokens=read_q)


def test_pe_assignment_skips_engines_over_beta() -> None:
    chosen = choose_prefill_engine([pe(0, 101, 0), pe(1, 50, 0)], alpha_tokens=10, beta_tokens=100)
    assert chosen is not None and chosen.engine_id == 1
    assert choose_prefill_engine([pe(0, 101, 0)], alpha_tokens=10, beta_tokens=100) is None


def test_beta_bounds_compute_tokens_not_prompt_tokens() -> None:
    # Engine 0 holds many prompt tokens that are nearly all hits: little GPU work, not overloaded.
    # Engine 1 holds fewer prompt tokens, all misses, over β: C1 although its tok is smaller.
    hit_heavy, miss_heavy = pe(0, 10_000, 0, compute_tok=50), pe(1, 200, 0, compute_tok=200)
    chosen = choose_prefill_engine([hit_heavy, miss_heavy], alpha_tokens=10, beta_tokens=100)
    assert chosen is not None and chosen.engine_id == 0


def test_algorithm1_charges_miss_tokens_against_beta() -> None:
    # Prompts of 1,000 tokens with 960 hits: tok grows by 1,000, compute_tok by 40 per request.
    queue = [make_request(i, prompt=1000, hit=960) for i in range(5)]
    cands = [pe(0, 0, 0)]
    out = assign_prefill_engines(queue, cands, alpha_tokens=10**9, beta_tokens=100)
    assert out == [(0, 0), (1, 0), (2, 0)]  # compute_tok 40, 80, 120 > β: C1 after the third
    assert (cands[0].tok, cands[0].compute_tok) == (3000, 120)


def test_c2_preferred_over_c3() -> None:
    # Engine 0 has less tok but its node's read queue is over α: C3. Engine 1 is C2 and wins.
    chosen = choose_prefill_engine([pe(0, 1, 50), pe(1, 90, 5)], alpha_tokens=10, beta_tokens=100)
    assert chosen is not None and chosen.engine_id == 1


def test_c3_used_when_c2_empty_and_min_tok_wins() -> None:
    chosen = choose_prefill_engine([pe(0, 30, 50), pe(1, 20, 60)], alpha_tokens=10, beta_tokens=100)
    assert chosen is not None and chosen.engine_id == 1


def test_algorithm1_adds_tokens_and_stops_when_all_over_beta() -> None:
    queue = [make_request(i, prompt=60, hit=0) for i in range(5)]
    out = assign_prefill_engines(queue, [pe(0, 0, 0), pe(1, 0, 0)], alpha_tokens=10, beta_tokens=100)
    # tok grows by 60 per request: 0,1 take one each (60), again (120 > β) -> both in C1 after 4.
    assert out == [(0, 0), (1, 1), (2, 0), (3, 1)]


def route(requests: list[Request], tok: dict[int, int]) -> list[tuple[int, int]]:
    """`route_to_de_groups` with the groups' Σtok given as {group id: Σtok}."""
    tokens = GroupTokens(list(tok))
    for group, group_tok in tok.items():
        tokens[group] = group_tok
    return route_to_de_groups(requests, tokens)


def route_by_scan(requests: list[Request], tok: dict[int, int]) -> list[tuple[int, int]]:
    """Phase 1 as written in §6.2: each request to the min (Σtok, id), whose Σtok then grows by len_r."""
    tok = dict(tok)
    out = []
    for request in requests:
        group = min(tok, key=lambda g: (tok[g], g))
        tok[group] += request.total_tokens
        out.append((request.request_id, group))
    return out


def test_de_groups_get_requests_by_smallest_group_tokens() -> None:
    reqs = [make_request(i, prompt=100, hit=0) for i in range(3)]
    out = route(reqs, {5: 300, 6: 0})
    assert [g for _, g in out] == [6, 6, 6]  # group 6 reaches 330 only after the third
    out = route(reqs, {5: 150, 6: 0})
    assert [g for _, g in out] == [6, 6, 5]
    assert route([make_request(0, prompt=10, hit=0)], {7: 50, 3: 50, 5: 60}) == [(0, 3)]  # tie: lowest id


def test_routing_matches_the_scan_of_every_group() -> None:
    """Bursts of any size, with many ties, go where the rule's plain scan sends them."""
    for seed in range(10):
        for size in (1, 2, 5, 8, 9, 30):
            start = {g: (g * 7919 + seed * 104729) % 7 * 100 for g in range(40, 10, -3)}
            burst = [make_request(i, prompt=50 + (i * 37 + seed) % 400, hit=0) for i in range(size)]
            assert route(burst, start) == route_by_scan(burst, start)


def test_group_tokens_keep_the_smallest_group_through_random_changes() -> None:
    import random

    rng = random.Random(7)
    ids = rng.sample(range(200), 40)
    tokens, tok = GroupTokens(ids), dict.fromkeys(ids, 0)
    for _ in range(3000):
        group = rng.choice(ids)
        tok[group] = rng.choice([0, tok[group], rng.randrange(5) * 100, rng.randrange(10**6)])
        tokens[group] = tok[group]
        assert tokens.smallest() == min(ids, key=lambda g: (tok[g], g))
        assert all(tokens[g] == tok[g] for g in ids[:5])
    with pytest.raises(KeyError):
        tokens[max(ids) + 1] = 0
    with pytest.raises(ValueError, match="distinct"):
        GroupTokens([3, 3])


def de(engine: int, seq: int, tok: int, free: int) -> DeCandidate:
    return DeCandidate(engine_id=engine, node_id=1, seq=seq, tok=tok, free_hbm_tokens=free)


def test_de_prefers_non_high_token_engine_with_min_seq() -> None:
    r = make_request(0, prompt=90, hit=0, gen=10)  # len_r = 100
    # Z = 1.05 * (100 + 0 + 400 + 100) / 3 = 210: engine 1 (tok 400) is high-token; 0 and 2 are not.
    cands = [de(0, 5, 0, 1000), de(1, 0, 400, 1000), de(2, 2, 100, 1000)]
    assert assign_within_de_group(fifo_of([r]), cands, z_factor=1.05) == [(0, 2)]


def test_de_falls_back_to_high_token_engine_with_min_tok() -> None:
    r = make_request(0, prompt=90, hit=0, gen=10)
    cands = [de(0, 0, 900, 1000), de(1, 0, 500, 1000)]  # both high-token; engine 1 has less tok
    cands[0].free_hbm_tokens = 1000
    assert assign_within_de_group(fifo_of([r]), cands, z_factor=0.1) == [(0, 1)]


def test_de_fetch_stops_when_head_does_not_fit() -> None:
    big, small = make_request(0, prompt=900, hit=0, gen=100), make_request(1, prompt=10, hit=0, gen=1)
    assert (
        assign_within_de_group(fifo_of([big, small]), [de(0, 0, 0, 500), de(1, 0, 0, 600)], z_factor=1.05)
        == []
    )


def test_shorter_queue_reads_whole_request_from_shorter_side() -> None:
    pol = make_read_path_policy("shorter-queue")
    short, long = (
        NodeReadState(read_q_tokens=10, read_tokens_per_s=1.0),
        NodeReadState(read_q_tokens=99, read_tokens_per_s=1.0),
    )
    assert pol.plan(640, pe_node=long, de_node=short, block_tokens=64).de_read_tokens == 640
    assert pol.plan(640, pe_node=short, de_node=long, block_tokens=64).pe_read_tokens == 640


def test_split_read_divides_by_drain_rate() -> None:
    # PE drains 3x faster with equal empty queues: PE share = 3/4 of 1280 = 960 (whole blocks).
    plan = Split().plan(1280, pe_node=NodeReadState(read_q_tokens=0, read_tokens_per_s=3.0),
                        de_node=NodeReadState(read_q_tokens=0, read_tokens_per_s=1.0), block_tokens=64)  # fmt: skip
    assert (plan.pe_read_tokens, plan.de_read_tokens) == (960, 320)
    # A long PE queue sends everything to the DE side.
    plan = Split().plan(1280, pe_node=NodeReadState(read_q_tokens=10**6, read_tokens_per_s=1.0),
                        de_node=NodeReadState(read_q_tokens=0, read_tokens_per_s=1.0), block_tokens=64)  # fmt: skip
    assert plan.pe_read_tokens == 0


def quadratic(pairs: list[tuple[int, int]]) -> float:
    return sum(new * (cached + new) for cached, new in pairs) * 1e-6


def test_quota_packs_fifo_while_under_quota() -> None:
    q = [PrefillWork(request_id=i, cached_tokens=0, remaining_tokens=100) for i in range(5)]
    batch = pack_by_compute_quota(q, attention_time_s=quadratic, quota_s=0.035)  # 0.01 s each
    assert [b.request_id for b in batch[:3]] == [0, 1, 2]
    assert sum(quadratic([(b.cached_tokens, b.new_tokens)]) for b in batch) <= 0.035


def test_chunked_prefill_binary_search() -> None:
    q = [PrefillWork(request_id=0, cached_tokens=0, remaining_tokens=100),
         PrefillWork(request_id=1, cached_tokens=1000, remaining_tokens=500)]  # fmt: skip
    batch = pack_by_compute_quota(q, attention_time_s=quadratic, quota_s=0.2)
    assert batch[0].new_tokens == 100
    chunk = batch[1].new_tokens
    assert 0 < chunk < 500
    assert quadratic([(0, 100), (1000, chunk)]) <= 0.2 < quadratic([(0, 100), (1000, chunk + 1)])


def test_token_budget_chunks_overflow_and_bounds_kv() -> None:
    q = [PrefillWork(request_id=i, cached_tokens=1000, remaining_tokens=300) for i in range(3)]
    assert [b.new_tokens for b in pack_by_token_budget(q, max_new_tokens=500)] == [300, 200]
    assert len(pack_by_token_budget(q, max_new_tokens=5000, max_kv_tokens=2000)) == 1


def test_kv_traffic_is_low_priority_and_collectives_high() -> None:
    assert traffic_class(TransferKind.COLLECTIVE) is TrafficClass.HIGH
    assert all(traffic_class(k) is TrafficClass.LOW for k in TransferKind if k is not TransferKind.COLLECTIVE)


def test_scheduler_places_de_then_pe_and_logs_read_side() -> None:
    s = RequestScheduler(pe_nodes={0: [0, 1]}, de_nodes={1: [2, 3]}, spec=SchedulerSpec(),
                         read_path=make_read_path_policy("shorter-queue"), read_tokens_per_s={0: 1.0, 1: 1.0},
                         alpha_tokens=1e9, beta_tokens=1e9)  # fmt: skip
    for i in range(3):
        s.submit(make_request(i))
    de_loads = [
        EngineLoad(
            engine_id=e, node_id=1, seq=0, tok=0, compute_tok=0, read_q_tokens=0, free_hbm_tokens=10**6
        )
        for e in (2, 3)
    ]
    placed = s.fetch_de_group(1, de_loads)
    assert len(placed) == 3 and all(r.de_engine in (2, 3) for r, _ in placed)
    pe_loads = [
        EngineLoad(engine_id=e, node_id=0, seq=0, tok=0, compute_tok=0, read_q_tokens=0) for e in (0, 1)
    ]
    out = s.fetch_pe_group(0, pe_loads)
    assert [a.request_id for a in out] == [0, 1, 2]
    # Equal queues: PE side first; then the PE node's queue is longer, so the DE side reads.
    assert [a.side.value for a in out] == ["pe_read", "de_read", "pe_read"]
    assert s.log.assignments == out


def test_node_set_answers_as_a_set_and_lists_its_members_in_id_order() -> None:
    import random

    from dualpath.policy.scheduler import NodeSet

    rng = random.Random(3)
    nodes, reference = NodeSet(64), set()
    for step in range(4000):
        node_id = rng.randrange(64)
        if rng.random() < 0.5:
            nodes.add(node_id)
            reference.add(node_id)
        else:
            nodes.discard(node_id)
            reference.discard(node_id)
        assert (node_id in nodes) == (node_id in reference)
        if step % 7 == 0:
            assert nodes.in_order() == sorted(reference)
