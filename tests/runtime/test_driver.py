"""`RuntimeDriver` on a virtual clock with a fake executor: the core's commands as node messages."""

from __future__ import annotations

import pytest
from fake_cluster import DECODE_STEP_S, FakeCluster, small_config

from dualpath.policy.decisions import Assignment, BatchDecision
from dualpath.runtime.driver import RuntimeDriver

MODES = ("basic", "layerwise", "dualpath-rr", "dualpath", "oracle")


def _workload(cluster: FakeCluster, n: int = 6) -> dict[int, int]:
    """n requests at staggered times, with hits, several long enough to be chunked/batched."""
    want = {}
    for i in range(n):
        prompt = [(7 * i + k) % 250 for k in range(64 + 48 * i)]
        hit = 32 * (i % 3)
        max_tokens = 1 + (3 * i) % 7
        cluster.submit_at(0.0 if i < 4 else 0.05 * i, prompt, hit, max_tokens)
        want[i] = max_tokens
    return want


@pytest.mark.parametrize("mode", MODES)
def test_every_request_finishes_with_its_tokens(mode: str) -> None:
    driver = RuntimeDriver(small_config(mode))
    cluster = FakeCluster(driver)
    want = _workload(cluster)
    cluster.run()
    assert sorted(cluster.done) == sorted(want)
    for rid, n in want.items():
        assert len(cluster.tokens[rid]) == n, rid
        assert cluster.tokens[rid][0] == 1000 + rid  # token 1 from the PE's forward
        assert all(t == 2000 + rid for t in cluster.tokens[rid][1:])  # the rest from decode steps
    assert driver.active_requests == 0 and driver.core.active_requests == 0
    driver.core.check_invariants()
    assert sorted(a.request_id for a in driver.log.assignments) == sorted(want)
    kinds = {m["type"] for _, dest, m in cluster.sent}
    if mode == "oracle":
        # §7.1: reads, H2D and PD transfers skipped in time; persists are the core's, unpaced on the node
        assert not kinds & {"read", "h2d"} and "persist" in kinds
    else:
        assert {"read", "h2d", "persist"} <= kinds


def test_step_messages_follow_the_core_batches() -> None:
    driver = RuntimeDriver(small_config("dualpath"))
    cluster = FakeCluster(driver)
    _workload(cluster, n=8)
    cluster.run()
    steps = [m for _, _, m in cluster.sent if m["type"] == "step"]
    batches = [b for b in driver.log.batches if b.items]
    assert len(steps) == len(batches)
    for message, batch in zip(steps, batches, strict=True):
        assert [(i["rid"], i["cached_tokens"], i["new_tokens"]) for i in message["items"]] == [
            (b.request_id, b.cached_tokens, b.new_tokens) for b in batch.items
        ]
    assert max(len(s["items"]) for s in steps) > 1  # several requests share one forward


def test_decode_runs_cover_each_request_once_per_token_and_stop_at_last_tokens() -> None:
    driver = RuntimeDriver(small_config("dualpath"))
    cluster = FakeCluster(driver)
    want = _workload(cluster)
    cluster.run()
    for node in ("d0", "d1"):
        runs = [m for _, dest, m in cluster.sent if dest == node and m["type"] == "decode_step"]
        assert [m["step"] for m in runs] == list(range(1, len(runs) + 1))
        for m in runs:
            assert all(want[rid] >= 2 for rid in m["batch"])
            assert 1 <= m["steps"] <= driver.config.max_decode_run_steps
    per_rid: dict[int, int] = {}
    lengths = []
    for _, event in driver.event_log:
        if event["type"] == "decode_done":
            lengths.append(event["steps"])
            for rid, tokens in event["tokens"]:
                assert len(tokens) == event["steps"]
                per_rid[rid] = per_rid.get(rid, 0) + event["steps"]
    assert per_rid == {rid: n - 1 for rid, n in want.items() if n >= 2}  # the DE decodes tokens 2..n
    assert max(lengths) > 1  # one message served several steps


def _long_decodes(cluster: FakeCluster) -> None:
    """Staggered arrivals with long generations: joiners arrive while runs are in flight."""
    for i in range(8):
        cluster.submit_at(0.011 * i, [(5 * i + k) % 250 for k in range(40)], 0, 20 + i)


def test_runs_of_steps_make_the_decisions_of_one_step_per_message() -> None:
    """On the virtual clock a run of k steps ends when k single steps would: same decisions and tokens
    with far fewer decode messages; a finish moves by at most one run (a block that filled mid-run
    starts its persist at the run's end)."""
    results = []
    for cap in (1, 8):
        driver = RuntimeDriver(small_config("dualpath", max_decode_run_steps=cap))
        cluster = FakeCluster(driver)
        _workload(cluster, n=8)
        _long_decodes(cluster)
        cluster.run()
        cuts = cluster.cuts
        runs = sum(m["type"] == "decode_step" for _, _, m in cluster.sent)
        finished = {rid: d["times_s"]["finished"] for rid, d in cluster.done.items()}
        results.append((driver.log.entries, dict(cluster.tokens), finished, runs))
    (log1, tokens1, done1, runs1), (log8, tokens8, done8, runs8) = results
    assert log8 == log1 and tokens8 == tokens1
    assert done8.keys() == done1.keys()
    assert all(abs(done8[r] - done1[r]) <= 8 * DECODE_STEP_S + 1e-9 for r in done1)
    assert runs8 < runs1
    assert cuts > 0  # (of the cap-8 run) joiners cut runs short at a step boundary


def test_corrupt_read_shrinks_the_usable_hit_in_the_step() -> None:
    driver = RuntimeDriver(small_config("dualpath", read_path="pe-read"))
    cluster = FakeCluster(driver, corrupt_reads={1: 16})
    _workload(cluster, n=3)
    cluster.run()
    items = [i for _, _, m in cluster.sent if m["type"] == "step" for i in m["items"] if i["rid"] == 1]
    # The core shrank the hit (`on_read_done(..., usable_tokens)`): the first chunk computes from 16.
    assert items and all(i["hit_tokens"] == 16 for i in items)
    assert items[0]["cached_tokens"] == 16 and items[0]["load_pe_tokens"] == 16
    assert cluster.done[1]["effective_hit_tokens"] == 16 and cluster.done[1]["hit_tokens"] == 32
    persists = [m for _, _, m in cluster.sent if m["type"] == "persist" and m["rid"] == 1]
    assert persists[0]["start_tokens"] == 16  # the lost block is written again


def test_fetch_only_when_something_waits() -> None:
    driver = RuntimeDriver(small_config("dualpath"))
    assert not driver.wants_fetch
    _, out = driver.submit(token_ids=list(range(40)), hit_tokens=16, max_tokens=2, now_s=0.0)
    assert out == [] and driver.wants_fetch
    out = driver.handle({"type": "fetch"}, 0.0)
    assert not driver.wants_fetch
    assert [m["type"] for _, m in out] == ["read"]  # hit on storage: the read starts first
    assert isinstance(driver.log.entries[0], Assignment)
    with pytest.raises(ValueError, match="unknown driver event"):
        driver.handle({"type": "nonsense"}, 0.0)


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_replay_of_the_event_log_reproduces_messages_and_decisions(mode: str) -> None:
    config = small_config(mode)
    driver = RuntimeDriver(config)
    cluster = FakeCluster(driver)
    _workload(cluster, n=7)
    cluster.run()
    replayed, out = RuntimeDriver.replay(config, driver.event_log)
    sent = [(t, dest, m) for t, messages in out for dest, m in messages]
    assert sent == cluster.sent
    assert replayed.log.entries == driver.log.entries
    assert any(isinstance(e, BatchDecision) for e in replayed.log.entries)


@pytest.mark.parametrize("mode", ["dualpath", "oracle"])
def test_a_driver_that_records_nothing_sends_the_same_and_keeps_nothing(mode: str) -> None:
    """`record=False` (a server without `--event-log`): the same messages to the nodes and the client,
    no input event or decision kept once read, the read-token sums whole."""
    runs = {}
    for record in (True, False):
        driver = RuntimeDriver(small_config(mode), record=record)
        cluster = FakeCluster(driver)
        _workload(cluster, n=7)
        cluster.run()
        runs[record] = (driver, cluster)
    (kept, kept_cluster), (bare, bare_cluster) = runs[True], runs[False]
    assert bare_cluster.sent == kept_cluster.sent and bare_cluster.done == kept_cluster.done
    assert kept.event_log and kept.log.assignments
    assert bare.event_log == [] and not any(isinstance(e, Assignment) for e in bare.log.entries)
    assert bare.log.read_tokens() == kept.log.read_tokens()


def test_oracle_persists_through_the_cores_commands() -> None:
    """§7.1 Oracle = DualPath with I/O time skipped, not less work: the core sends the same persists as
    in DualPath (a 1-token round's prompt blocks from DRAM, a decoding round's filled blocks from HBM),
    and the client hears `done` only after their `persist_done`."""
    driver = RuntimeDriver(small_config("oracle"))
    cluster = FakeCluster(driver)
    cluster.submit_at(0.0, list(range(70)), 16, 1)  # blocks [16, 64) are new; 6 tokens of a partial block
    cluster.submit_at(0.0, list(range(100, 150)), 0, 20)  # decodes past 64 tokens: one block from HBM
    cluster.run()
    persists = [(m["rid"], m["start_tokens"], m["end_tokens"], m["from_hbm"])
                for _, _, m in cluster.sent if m["type"] == "persist"]  # fmt: skip
    assert persists == [(0, 16, 64, False), (1, 0, 48, False), (1, 48, 64, True)]
    assert not any(m["type"] == "h2d" or m["type"] == "read" for _, _, m in cluster.sent)
    for rid in (0, 1):
        landed = max(t for t, e in driver.event_log if e["type"] == "persist_done" and e["rid"] == rid)
        assert cluster.done[rid]["times_s"]["finished"] >= landed - 0.0  # done only once written
    kinds = [(m["type"], m["rid"]) for _, _, m in cluster.sent if m["type"] in ("persist", "done")]
    assert kinds.index(("persist", 0)) < kinds.index(("done", 0))


def test_a_decode_report_of_no_run_in_flight_is_dropped() -> None:
    """A DE that was marked down may still send a run's end it computed before; after it joined again
    (or once nothing runs) that report is stale: dropped, the core's decode books untouched."""
    driver = RuntimeDriver(small_config("dualpath"))
    cluster = FakeCluster(driver)
    _workload(cluster, n=3)
    cluster.run()
    node = driver.node_id("d0")
    steps_before = driver.core.de_nodes[node].steps_done
    stale = {"type": "decode_done", "node": "d0", "step": 1, "steps": 1, "tokens": []}
    assert driver.handle(stale, cluster.now_s + 1.0) == []
    assert driver.core.de_nodes[node].steps_done == steps_before
