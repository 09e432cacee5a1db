"""A DE group's fetch that cannot place anything is skipped until something it depends on changes."""

from __future__ import annotations

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
    assert s.has_de_work(1)
    full = [
        EngineLoad(
            engine_id=1, node_id=1, seq=3, tok=5000, compute_tok=0, read_q_tokens=0, free_hbm_tokens=100
        )
    ]
    assert s.fetch_de_group(1, full) == []  # does not fit
    assert not s.has_de_work(1)  # the same fetch would stop at the same head
    s.note_de_freed(1)
    assert s.has_de_work(1)
    roomy = [
        EngineLoad(
            engine_id=1, node_id=1, seq=2, tok=3000, compute_tok=0, read_q_tokens=0, free_hbm_tokens=5000
        )
    ]
    assert [r.request_id for r, _ in s.fetch_de_group(1, roomy)] == [0]
    assert not s.has_de_work(1)
    s.submit(Request(request_id=1, trajectory_id=1, round_index=0, prompt_tokens=10, hit_tokens=0,
                     gen_tokens=1, arrival_s=0.0))  # fmt: skip
    assert s.has_de_work(1)  # the global queue has something to route
