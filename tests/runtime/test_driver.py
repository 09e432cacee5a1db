"""`RuntimeDriver` on a virtual clock with a fake executor: the core's commands as node messages."""

from __future__ import annotations

import pytest
from fake_cluster import FakeCluster, small_config

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
        assert not kinds & {"read", "h2d", "persist"}  # §7.1: every transfer skipped in time
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


def test_decode_runs_one_step_per_message_for_the_core_batch() -> None:
    driver = RuntimeDriver(small_config("dualpath"))
    cluster = FakeCluster(driver)
    want = _workload(cluster)
    cluster.run()
    for node in ("d0", "d1"):
        steps = [m for _, dest, m in cluster.sent if dest == node and m["type"] == "decode_step"]
        assert [m["step"] for m in steps] == list(range(1, len(steps) + 1))
        for m in steps:
            assert all(want[rid] >= 2 for rid in m["batch"])
    per_rid: dict[int, int] = {}
    for _, _, m in cluster.sent:
        if m["type"] == "decode_step":
            for rid in m["batch"]:
                per_rid[rid] = per_rid.get(rid, 0) + 1
    assert per_rid == {rid: n - 1 for rid, n in want.items() if n >= 2}  # the DE decodes tokens 2..n


def test_corrupt_read_shrinks_the_usable_hit_in_the_step() -> None:
    driver = RuntimeDriver(small_config("dualpath", read_path="pe-read"))
    cluster = FakeCluster(driver, corrupt_reads={1: 16})
    _workload(cluster, n=3)
    cluster.run()
    items = [i for _, _, m in cluster.sent if m["type"] == "step" for i in m["items"] if i["rid"] == 1]
    assert items and all(i["hit_tokens"] == 32 and i["usable_hit_tokens"] == 16 for i in items)
    assert cluster.done[1]["effective_hit_tokens"] == 16 and cluster.done[1]["hit_tokens"] == 32


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
