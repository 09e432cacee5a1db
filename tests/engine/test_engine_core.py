"""Engine state machines: layerwise pipeline, storage reader, decode runs, and the whole ClusterCore."""

from __future__ import annotations

import dataclasses
import heapq

import pytest

from dualpath.config.specs import SchedulerSpec
from dualpath.engine import commands as cmd
from dualpath.engine.buffers import CapacityPool
from dualpath.engine.core import ClusterCore, CoreConfig
from dualpath.engine.decode import DecodeEngine, DecodeNode
from dualpath.engine.modes import MODES, get_mode
from dualpath.engine.pipeline import LayerwisePipeline
from dualpath.engine.storage_reader import ReadPart, StorageReader
from dualpath.request import Phase, Request


def run_pipeline(layers: int, load_s: float, compute_s: float, send_s: float) -> float:
    """Drive LayerwisePipeline on a virtual clock; return when the last send finishes."""
    p = LayerwisePipeline(layers)
    events: list[tuple[float, int, str, int]] = []
    seq = 0
    dur = {"load": load_s, "compute": compute_s, "send": send_s}

    def issue(now: float, ops: list) -> None:  # type: ignore[type-arg]
        nonlocal seq
        for op in ops:
            seq += 1
            heapq.heappush(events, (now + dur[op.kind], seq, op.kind, op.layer))

    issue(0.0, p.start())
    now = 0.0
    while events:
        now, _, kind, layer = heapq.heappop(events)
        issue(now, {"load": p.on_loaded, "compute": p.on_computed, "send": p.on_sent}[kind](layer))
        p.check_invariants()
    assert p.done
    return now


def test_layerwise_pipeline_takes_layers_plus_one_layer_times() -> None:
    assert run_pipeline(30, 1.0, 1.0, 0.0) == pytest.approx(31.0)
    assert run_pipeline(30, 1.0, 2.0, 0.0) == pytest.approx(1.0 + 60.0)  # compute-bound
    assert run_pipeline(30, 2.0, 1.0, 0.0) == pytest.approx(60.0 + 1.0)  # load-bound


def test_storage_reader_is_fifo_with_limited_inflight_and_admission() -> None:
    r = StorageReader(0, max_inflight_reads=2)
    for i in range(4):
        r.enqueue(ReadPart(request_id=i, node_id=0, tokens=64, reserve_bytes=10.0))
    buffer = CapacityPool(25.0, name="dram")
    assert [p.request_id for p in r.admit(buffer)] == [0, 1]
    assert buffer.holds(0) and buffer.holds(1) and buffer.used == 20.0
    assert r.read_q_tokens == 256
    part = r.in_flight(1)
    assert part is not None and part.request_id == 1 and r.in_flight(2) is None
    with pytest.raises(KeyError):
        r.finish(2)  # queued, not in flight
    r.finish(0)
    assert r.in_flight(0) is None and r.inflight == 1 and r.read_q_tokens == 192
    assert r.admit(buffer) == []  # buffer full (5 bytes left): the head waits
    buffer.release(0)
    assert [p.request_id for p in r.admit(buffer)] == [2]
    r.check_invariants()


def test_a_read_part_reserves_its_buffer_for_its_owner_by_identity() -> None:
    owners = [object(), object()]
    r = StorageReader(0, max_inflight_reads=2)
    for i, owner in enumerate(owners):
        r.enqueue(ReadPart(request_id=i, node_id=0, tokens=64, reserve_bytes=10.0, owner=owner))
    buffer = CapacityPool(25.0, name="dram")
    assert [p.request_id for p in r.admit(buffer)] == [0, 1]
    assert buffer.holds(owners[0]) and buffer.holds(owners[1]) and not buffer.holds(0)
    assert buffer.release(owners[1]) == 10.0 and not buffer.holds(owners[1])
    with pytest.raises(KeyError):
        buffer.release(owners[1])  # a double release is caught


def test_decode_node_jumps_to_second_token_blocks_and_last() -> None:
    node = DecodeNode(0, [DecodeEngine(0, 0, 10**6)], block_tokens=64)
    r = Request(request_id=1, trajectory_id=0, round_index=0, prompt_tokens=100, hit_tokens=0, gen_tokens=40,
                arrival_s=0.0, de_engine=0, generated_tokens=1, persisted_tokens=64)  # fmt: skip
    node.joining.append(r)
    assert node.merge_joiners()
    assert node.steps_to_next_event() == 1
    ev = node.advance(1)
    assert ev[0].second_token and r.generated_tokens == 2
    # kv = 100 + g - 1 reaches 128 at g = 29: 27 steps later.
    assert node.steps_to_next_event() == 27
    ev = node.advance(27)
    assert ev[0].persist_tokens == 64 and not ev[0].finished
    assert node.steps_to_next_event() == 40 - 29
    assert node.advance(11)[0].finished
    node.check_invariants()


def make_core(mode: str, *, p: int = 1, d: int = 1, g: int = 2, read_path: str | None = None) -> ClusterCore:
    return ClusterCore(
        CoreConfig(
            num_prefill_nodes=p,
            num_decode_nodes=d,
            engines_per_node=g,
            mode=get_mode(mode),
            scheduler=SchedulerSpec(),
            kv_bytes_per_token=100.0,
            dram_buffer_bytes=2e6,
            de_hbm_kv_tokens=20_000,
            pe_hbm_kv_tokens=20_000,
            read_tokens_per_s=1e6,
            alpha_tokens=3e6,
            beta_tokens=50_000,
            read_path=read_path,
        ),  # fmt: skip
        attention_time_s=lambda pairs: sum(n * (c + n) for c, n in pairs) * 1e-7,
    )


def drive(
    core: ClusterCore, requests: list[Request], pending: list[cmd.Command] | None = None
) -> list[cmd.Command]:
    """A zero-latency driver: every command completes at once (FIFO), invariants checked each call.
    `pending`: commands the caller already took from the core, executed first."""
    seen: list[cmd.Command] = []
    todo: list[cmd.Command] = list(pending or [])
    for r in requests:
        core.submit(r, 0.0)
    todo += core.fetch(0.0)
    for _ in range(100_000):
        if not todo:
            todo += core.fetch(0.0)
            running = False
            for n in core.de_nodes:
                steps = core.start_decode_run(n)
                if steps:
                    running = True
                    todo += core.advance_decode(n, steps, 0.0)
            if not todo and not running:
                break
            continue
        c = todo.pop(0)
        seen.append(c)
        if isinstance(c, cmd.StartRead):
            todo += core.on_read_done(c.node_id, c.request_id, 0.0)
        elif isinstance(c, cmd.StartPrefillStep):
            todo += core.on_prefill_step_done(c.node_id, c.step_id, 0.0)
            todo += core.on_kv_out_done(c.node_id, c.step_id, 0.0)
        elif isinstance(c, cmd.StartH2D):
            todo += core.on_h2d_done(c.request_id, 0.0)
        elif isinstance(c, cmd.StartPersist):
            todo += core.on_persist_done(c.request_id, c.from_hbm, 0.0)
        core.check_invariants()
    return seen


def requests(n: int) -> list[Request]:
    return [Request(request_id=i, trajectory_id=i, round_index=0, prompt_tokens=3000 + 7 * i, hit_tokens=2880,
                    gen_tokens=1 + (i * 37) % 150, arrival_s=0.0) for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_request_finishes_and_frees_everything(mode: str) -> None:
    core = make_core(mode)
    reqs = requests(12)
    seen = drive(core, reqs)
    done = [c.request_id for c in seen if isinstance(c, cmd.RequestDone)]
    assert sorted(done) == list(range(12))
    assert all(r.phase is Phase.DONE for r in reqs)
    assert core.active_requests == 0
    assert all(pool.used == 0 for pool in core.buffers)
    assert all(e.reserved_tokens == 0 for n in core.de_nodes.values() for e in n.engines)
    reads = [c for c in seen if isinstance(c, cmd.StartRead)]
    assert (not reads) if mode == "oracle" else len(reads) >= 12


def test_milestones_are_one_two_and_last() -> None:
    seen = drive(make_core("dualpath"), requests(4))
    by_req: dict[int, list[int]] = {}
    for c in seen:
        if isinstance(c, cmd.TokenMilestone):
            by_req.setdefault(c.request_id, []).append(c.token_index)
    gens = {r.request_id: r.gen_tokens for r in requests(4)}
    for rid, idx in by_req.items():
        assert idx == sorted(set([1, 2, gens[rid]]) & set(range(1, gens[rid] + 1)))


def test_decode_persists_every_filled_block_once() -> None:
    reqs = requests(6)
    seen = drive(make_core("dualpath"), reqs)
    for r in reqs:
        persisted = sum(
            c.tokens for c in seen if isinstance(c, cmd.StartPersist) and c.request_id == r.request_id
        )
        assert persisted == r.kv_tokens // 64 * 64 - r.hit_tokens


def _plain(value: object) -> bool:
    """Ints, floats, bools, strings, None, tuples of them, or a step's items."""
    if value is None or isinstance(value, (int, float, str)):
        return True
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, cmd.StepItem):
        return all(_plain(getattr(value, f)) for f in value._fields)  # noqa: SLF001
    return False


@pytest.mark.parametrize("mode", sorted(MODES))
def test_commands_carry_plain_values_not_the_cores_request(mode: str) -> None:
    """A driver reads a command, never the core's live `Request` through it (vLLM's scheduler output
    carries ids and counts the same way)."""
    seen = drive(make_core(mode, d=2), requests(8))
    assert seen
    for c in seen:
        assert all(_plain(getattr(c, f)) for f in c._fields), c  # noqa: SLF001


def test_a_requests_persists_tile_its_blocks_and_its_reads_tile_its_hit() -> None:
    """The ranges the commands name: each persist starts where the previous ended, from the hit to the
    last Full Block; a split read's two parts are [0, pe) and [pe, hit)."""
    reqs = requests(6)
    seen = drive(make_core("dualpath", read_path="split", d=2), reqs)
    split = 0
    for r in reqs:
        persists = [c for c in seen if isinstance(c, cmd.StartPersist) and c.request_id == r.request_id]
        starts = [c.start_tokens for c in persists]
        assert starts == [r.hit_tokens] + [c.end_tokens for c in persists[:-1]]
        assert persists[-1].end_tokens == r.kv_tokens // 64 * 64
        reads = sorted(
            (c.start_tokens, c.start_tokens + c.tokens, c.pe_side)
            for c in seen
            if isinstance(c, cmd.StartRead) and c.request_id == r.request_id
        )
        parts = [(0, r.pe_read_tokens, True), (r.pe_read_tokens, r.hit_tokens, False)]
        assert reads == [part for part in parts if part[1] > part[0]]
        split += len(reads) == 2
        last = [
            c.token_index
            for c in seen
            if isinstance(c, cmd.TokenMilestone) and c.request_id == r.request_id and c.last
        ]
        assert last == [r.gen_tokens]
    assert split  # some request read from both sides


def test_basic_reads_only_on_prefill_nodes_and_dualpath_uses_both() -> None:
    basic = [c for c in drive(make_core("basic", d=2), requests(12)) if isinstance(c, cmd.StartRead)]
    assert {c.node_id for c in basic} == {0}
    both = [c for c in drive(make_core("dualpath", read_path="alternating", d=2), requests(12))
            if isinstance(c, cmd.StartRead)]  # fmt: skip
    assert {c.node_id for c in both} >= {0, 1}


def test_decision_log_records_assignments_and_batches() -> None:
    core = make_core("dualpath")
    drive(core, requests(5))
    assert sorted(a.request_id for a in core.log.assignments) == list(range(5))
    batched = {i.request_id for b in core.log.batches for i in b.items}
    assert batched == set(range(5))


def test_cached_beta_groups_and_waiting_count_match_a_recount_through_a_run() -> None:
    """`ClusterCore._pe_open` (PE groups with an engine at or under β) and the scheduler's running
    `waiting` count are caches: a small β sends the group over it and back, and `drive` runs
    `check_invariants` (which compares both with a recount) after every command."""
    base = make_core("dualpath", d=2).config
    core = ClusterCore(
        dataclasses.replace(base, beta_tokens=200, de_hbm_kv_tokens=200_000, dram_buffer_bytes=2e7),
        attention_time_s=lambda pairs: sum(n * (c + n) for c, n in pairs) * 1e-7,
    )
    reqs = requests(24)
    assert reqs[0].miss_tokens * 2 > core.config.beta_tokens  # two requests put an engine over β
    for r in reqs:
        core.submit(r, 0.0)
    assert core.scheduler.waiting == 24
    first = core.fetch(0.0)
    assert core._pe_open == set()  # both engines of the one PE group over β: the fetch stopped placing
    core.check_invariants()
    assert core.scheduler.waiting == core.scheduler.waiting_recount() > 0
    seen = drive(core, [], first)
    done = {c.request_id for c in seen if isinstance(c, cmd.RequestDone)}
    assert done == set(range(24)) and core._pe_open == {0} and core.scheduler.waiting == 0


@pytest.mark.parametrize("open_groups", [set(), {0}, {3}, {1, 4}, {0, 2, 3}, {0, 1, 2, 3, 4}])
def test_fetch_visits_the_open_pe_groups_in_the_rotation_of_all_groups(open_groups: set[int]) -> None:
    """A fetch's PE groups (`_pe_fetch_order`): the open ones, in the order of the rotation over all P
    groups that starts at group `fetches mod P`; round robin visits all P in that rotation."""
    num = 5
    core = make_core("dualpath", p=num)
    rr = make_core("basic", p=num)
    assert rr.mode.scheduling == "round-robin"
    for fetches in range(2 * num + 1):
        rotation = [(fetches + k) % num for k in range(num)]
        core._fetches = rr._fetches = fetches
        core._pe_open, core._pe_open_ids = set(open_groups), sorted(open_groups)
        assert core._pe_fetch_order(False) == [n for n in rotation if n in open_groups]
        assert rr._pe_fetch_order(True) == rotation


def assert_reports_are_current(core: ClusterCore) -> None:
    """Every group's reports (`_pe_loads` / `_de_loads`, rewritten in place) say what its engines hold."""
    for n, pnode in core.pe_nodes.items():
        q = core.readers[n].read_q_tokens
        got = [
            (r.engine_id, r.node_id, r.seq, r.tok, r.compute_tok, r.read_q_tokens)
            for r in core._pe_loads(pnode)
        ]
        assert got == [(e.engine_id, n, e.seq, e.tok, e.compute_tok, q) for e in pnode.engines]
    for n, dnode in core.de_nodes.items():
        q, down = core.readers[n].read_q_tokens, n in core.down
        got = [
            (r.engine_id, r.node_id, r.seq, r.tok, r.read_q_tokens, r.free_hbm_tokens)
            for r in core._de_loads(dnode)
        ]
        assert got == [
            (e.engine_id, n, e.seq, e.reserved_tokens, q, 0 if down else e.free_hbm_tokens)
            for e in dnode.engines
        ]


def test_engine_reports_follow_every_change_of_their_engines() -> None:
    core = make_core("dualpath", p=1, d=2)
    assert_reports_are_current(core)
    for r in requests(6):
        core.submit(r, 0.0)
    commands = core.fetch(0.0)  # placements: seq, tok, compute_tok, reservations and read queues move
    assert commands and any(e.seq for e in core._pe)
    assert_reports_are_current(core)
    core.on_node_down(2)  # a dead DE group reports no free HBM
    assert_reports_are_current(core)
