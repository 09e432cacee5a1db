"""`ClusterCore.on_node_down` / `on_node_up` / `abandon` on the core alone: which requests are re-planned,
that the survivors' books are exact afterwards, and that nothing is placed on a dead node."""

from __future__ import annotations

import pytest
from test_engine_core import make_core

from dualpath.engine import commands as cmd
from dualpath.request import Phase, Request


def _request(rid: int, prompt: int = 512, hit: int = 256, gen: int = 8) -> Request:
    return Request(request_id=rid, trajectory_id=rid, round_index=0, prompt_tokens=prompt, hit_tokens=hit,
                   gen_tokens=gen, arrival_s=0.0)  # fmt: skip


def _placed(mode: str = "dualpath", n: int = 6) -> tuple[object, list[Request], list[cmd.Command]]:
    core = make_core(mode, p=2, d=2, g=1)
    requests = [_request(i) for i in range(n)]
    for r in requests:
        core.submit(r, 0.0)
    return core, requests, core.fetch(0.0)


@pytest.mark.parametrize("mode", ["basic", "dualpath", "dualpath-rr", "oracle"])
@pytest.mark.parametrize("node", [0, 1, 2, 3])
def test_the_requests_of_a_dead_node_are_re_planned_and_the_books_stay_exact(mode: str, node: int) -> None:
    core, requests, _ = _placed(mode)
    touching = {r.request_id for r in requests if node in
                {core.node_of_engine(e) for e in (r.pe_engine, r.de_engine) if e is not None}}  # fmt: skip
    down = core.on_node_down(node)
    assert {r.request_id for r in down.replan} == touching
    assert core.nodes_up == ((1, 2) if node < 2 else (2, 1))
    core.check_invariants()
    # nothing new lands on the dead node
    for i in range(10, 16):
        core.submit(_request(i), 0.0)
    core.fetch(0.0)
    for r in [*core._active.values()]:  # noqa: SLF001
        engines = [e for e in (r.pe_engine, r.de_engine) if e is not None]
        if r.request_id >= 10:
            assert node not in {core.node_of_engine(e) for e in engines}
    core.check_invariants()


def test_a_node_that_rejoins_is_placed_on_again() -> None:
    core, _, _ = _placed("dualpath")
    core.on_node_down(3)
    core.on_node_up(3)
    assert core.down == set() and core.nodes_up == (2, 2)
    for i in range(10, 30):
        core.submit(_request(i, hit=0), 0.0)
    core.fetch(0.0)
    assert any(r.de_engine == 3 for r in core._active.values())  # noqa: SLF001
    core.check_invariants()


@pytest.mark.parametrize("node", [0, 3])
def test_a_reset_node_is_the_one_the_core_reads(node: int) -> None:
    core, _, _ = _placed("dualpath")
    before = {**core.pe_nodes, **core.de_nodes}[node]
    core.on_node_down(node)
    core.on_node_up(node)
    after = {**core.pe_nodes, **core.de_nodes}[node]
    assert after is not before
    read = core.pe_node(node) if node < 2 else core.de_node(node)
    assert read is after
    with pytest.raises(KeyError):
        core.de_node(1)  # a PE node
    with pytest.raises(KeyError):
        core.pe_node(2)  # a DE node
    with pytest.raises(KeyError):
        core.scheduler._de_queue(0)  # noqa: SLF001
    core.check_invariants()


def test_abandon_takes_a_request_out_before_its_prefill_only() -> None:
    core = make_core("dualpath", p=1, d=1, g=1)
    queued = _request(0)
    core.submit(queued, 0.0)
    assert core.abandon(0) == [] and queued.phase is Phase.DONE
    assert core.scheduler.waiting == 0 and core.active_requests == 0
    reading = _request(1)
    core.submit(reading, 0.0)
    started = core.fetch(0.0)
    assert any(isinstance(c, cmd.StartRead) for c in started) and reading.phase is Phase.READING
    assert core.abandon(1) is not None
    assert all(r.read_q_tokens == 0 for r in core.readers)
    assert all(b.used == 0 for b in core.buffers)
    assert core.de_nodes[1].reserved_tokens == 0 and core.pe_nodes[0].engines[0].seq == 0
    core.check_invariants()
    assert core.abandon(1) is None  # gone
