"""Regression tests for modelling fixes in the decision core (docs/simulator.md, validation notes)."""

from __future__ import annotations

from dualpath.config.specs import SchedulerSpec
from dualpath.engine import commands as cmd
from dualpath.engine.core import ClusterCore, CoreConfig
from dualpath.engine.decode import DecodeEngine, DecodeNode
from dualpath.engine.modes import get_mode
from dualpath.request import Request


def basic_core(*, inflight: int = 2) -> ClusterCore:
    return ClusterCore(
        CoreConfig(
            num_prefill_nodes=1,
            num_decode_nodes=1,
            engines_per_node=2,
            mode=get_mode("basic"),
            scheduler=SchedulerSpec(),
            kv_bytes_per_token=100.0,
            dram_buffer_bytes=1e9,  # never full: only the queue depth limits reads
            de_hbm_kv_tokens=1_000_000,
            pe_hbm_kv_tokens=1_000_000,
            read_tokens_per_s=1e6,
            alpha_tokens=3e6,
            beta_tokens=50_000,
            max_inflight_reads=inflight,
        )
    )


def test_a_finished_read_starts_the_next_queued_read_on_its_node() -> None:
    core = basic_core(inflight=2)
    for i in range(5):
        core.submit(Request(request_id=i, trajectory_id=i, round_index=1, prompt_tokens=4096,
                            hit_tokens=4032, gen_tokens=8, arrival_s=0.0), 0.0)  # fmt: skip
    reads = [c for c in core.fetch(0.0) if isinstance(c, cmd.StartRead)]
    assert [c.request_id for c in reads] == [0, 1]  # queue depth 2
    # Old behaviour: the next read waited for an unrelated event (a prefill freeing the buffer, a
    # new assignment), leaving the SNIC idle with reads queued.
    after = core.on_read_done(0, 0, 0.1)
    started = [c.request_id for c in after if isinstance(c, cmd.StartRead)]
    assert started == [2]
    assert core.readers[0].inflight == 2
    core.check_invariants()


def test_decode_runs_past_second_tokens_and_blocks_to_the_next_last_token() -> None:
    node = DecodeNode(0, [DecodeEngine(0, 0, 10**6)], block_tokens=64)
    a = Request(request_id=1, trajectory_id=0, round_index=0, prompt_tokens=100, hit_tokens=0,
                gen_tokens=200, arrival_s=0.0)  # fmt: skip
    b = Request(request_id=2, trajectory_id=1, round_index=0, prompt_tokens=60, hit_tokens=0,
                gen_tokens=50, arrival_s=0.0)  # fmt: skip
    for r in (a, b):
        r.generated_tokens = 1
        r.persisted_tokens = r.prompt_tokens // 64 * 64
        r.de_engine = 0
        node.joining.append(r)
    assert node.merge_joiners()
    assert node.steps_to_next_event() == 1  # second tokens
    steps = node.steps_to_next_batch_change()
    assert steps == 49  # b's last token: 50 - 1 generated
    events = node.advance(steps)
    seconds = [e for e in events if e.second_token]
    assert {e.request.request_id for e in seconds} == {1, 2}
    assert all(e.step == 1 for e in seconds)  # when they really happened: step 1, not 49
    assert any(e.finished and e.request is b for e in events)
    assert sum(e.persist_tokens for e in events if e.request is a) == 64  # a's block 64..128 filled
    assert node.steps_to_next_batch_change() == 200 - 50


def test_second_token_milestone_is_back_dated_by_the_steps_run_past_it() -> None:
    core = basic_core()
    core.submit(Request(request_id=0, trajectory_id=0, round_index=0, prompt_tokens=128, hit_tokens=0,
                        gen_tokens=40, arrival_s=0.0), 0.0)  # fmt: skip
    todo = core.fetch(0.0)
    milestones: list[cmd.TokenMilestone] = []
    while todo:
        c = todo.pop(0)
        if isinstance(c, cmd.StartPrefillStep):
            todo += core.on_prefill_step_done(c.node_id, c.step_id, 0.0)
            todo += core.on_kv_out_done(c.node_id, c.step_id, 0.0)
        elif isinstance(c, cmd.StartH2D):
            todo += core.on_h2d_done(c.request_id, 0.0)
        elif isinstance(c, cmd.StartPersist):
            todo += core.on_persist_done(c.request_id, c.from_hbm, 0.0)
        elif isinstance(c, cmd.DecodeChanged):
            steps = core.start_decode_run(c.node_id)
            todo += core.advance_decode(c.node_id, steps, 1.0)
        elif isinstance(c, cmd.TokenMilestone):
            milestones.append(c)
    second = next(m for m in milestones if m.token_index == 2)
    assert second.steps_before_now == 40 - 1 - 1  # ran 39 steps to the last token; token 2 at step 1
    assert next(m for m in milestones if m.token_index == 40).steps_before_now == 0
