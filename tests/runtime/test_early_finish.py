"""Early finish on the driver (virtual clock, fake nodes): EOS/stop tokens and cancels end a request before
max_tokens; the core frees its DE HBM, persists only the blocks it filled and forgets it."""

from __future__ import annotations

from typing import Any

import pytest
from fake_cluster import DECODE_STEP_S, FakeCluster, small_config

from dualpath.runtime.driver import CLIENT, RuntimeDriver

MODES = ("basic", "dualpath", "oracle")
PROMPT_TOKENS = 70


class StoppingCluster(FakeCluster):
    """Fake nodes whose request `rid` draws a stop token as its `stop_at[rid]`-th output token (1: the
    PE's first), and whose DE ends a request at the next step boundary after a `decode_stop`."""

    def __init__(self, driver: RuntimeDriver, stop_at: dict[int, int]) -> None:
        super().__init__(driver)
        self.stop_at = stop_at
        self.stopped: set[int] = set()

    def _dispatch(self, out: list[tuple[str, dict[str, Any]]]) -> None:
        produced = {rid: len(tokens) for rid, tokens in self.tokens.items()}
        for dest, m in out:
            if dest == CLIENT and m["type"] == "tokens":
                produced[m["rid"]] = produced.get(m["rid"], 0) + len(m["token_ids"])
            elif m["type"] == "decode_step":  # what each request has produced when its run starts
                m["@have"] = {rid: produced.get(rid, 0) for rid in m["batch"]}
            elif m["type"] == "decode_stop":
                self.stopped.add(m["rid"])
                run = self.runs.get(dest)
                if run is not None and m["rid"] in run["message"]["batch"]:
                    done = min(int(run["steps"]), int((self.now_s - run["start"]) / DECODE_STEP_S) + 1)
                    self._run_end(dest, run, done)
        super()._dispatch(out)
        for _, dest, m in self.sent[-len(out) :] if out else []:
            if m["type"] == "step":  # a first token that is a stop token
                stopped = [
                    i["rid"] for i in m["items"] if i["completes_prefill"] and self.stop_at.get(i["rid"]) == 1
                ]
                if stopped:
                    for _, _, event in self._queue:
                        if (
                            event["type"] == "step_done"
                            and event["step_id"] == m["step_id"]
                            and event["node"] == dest
                        ):
                            event["stopped"] = stopped

    def _run_end(self, node: str, run: dict[str, Any], steps: int) -> None:
        m = run["message"]
        have = m.get("@have", {})
        tokens, finished, ran = [], [], 0
        for rid in m["batch"]:
            n = steps
            if rid in self.stop_at:
                n = min(n, max(0, self.stop_at[rid] - have[rid]))
            if rid in self.stopped:
                n = min(n, 1)
            tokens.append([rid, [2000 + rid] * n])
            ran = max(ran, n)
            if rid in self.stopped:
                finished.append([rid, have[rid] + n, "abort"])
            elif rid in self.stop_at and have[rid] + n == self.stop_at[rid]:
                finished.append([rid, have[rid] + n, "stop"])
        event = {
            "type": "decode_done",
            "node": node,
            "step": m["step"],
            "steps": max(1, ran),
            "tokens": tokens,
        }
        if finished:
            event["finished"] = finished
        self.runs[node] = {**run, "steps": steps, "event": event}
        self.at(run["start"] + max(1, ran) * DECODE_STEP_S, event)


def _submit_all(cluster: FakeCluster, n: int, max_tokens: int) -> None:
    for i in range(n):
        prompt = [(11 * i + k) % 250 for k in range(PROMPT_TOKENS)]
        cluster.submit_at(0.001 * i, prompt, 0, max_tokens)


def _assert_all_freed(driver: RuntimeDriver) -> None:
    assert driver.active_requests == 0 and driver.core.active_requests == 0
    driver.core.check_invariants()
    assert all(node.reserved_tokens == 0 for node in driver.core.de_nodes.values())
    assert all(node.num_running == 0 for node in driver.core.de_nodes.values())


@pytest.mark.parametrize("mode", MODES)
def test_stop_tokens_end_requests_early_and_free_everything(mode: str) -> None:
    driver = RuntimeDriver(small_config(mode))
    stop_at = {0: 1, 1: 2, 2: 5, 3: 17, 4: 40}  # 4 reaches max_tokens first: "length"
    cluster = StoppingCluster(driver, stop_at)
    _submit_all(cluster, 6, max_tokens=30)
    cluster.run()
    want = {0: 1, 1: 2, 2: 5, 3: 17, 4: 30, 5: 30}
    assert {rid: len(tokens) for rid, tokens in cluster.tokens.items()} == want
    reasons = {rid: done["finish_reason"] for rid, done in cluster.done.items()}
    assert reasons == {0: "stop", 1: "stop", 2: "stop", 3: "stop", 4: "length", 5: "length"}
    _assert_all_freed(driver)
    # a request that stopped at token 1 never decodes; persists never pass the KV a request has
    h2d = {m["rid"] for _, _, m in cluster.sent if m["type"] == "h2d"}
    assert 0 not in h2d
    joined = {j["rid"] for _, _, m in cluster.sent if m["type"] == "decode_step" for j in m["join"]}
    assert 0 not in joined and {1, 2, 3} <= joined
    for _, _, m in cluster.sent:
        if m["type"] == "persist":
            assert m["end_tokens"] <= PROMPT_TOKENS + want[m["rid"]] - 1


@pytest.mark.parametrize("mode", MODES)
def test_cancel_ends_a_request_wherever_it_is(mode: str) -> None:
    driver = RuntimeDriver(small_config(mode))
    cluster = StoppingCluster(driver, {})
    _submit_all(cluster, 4, max_tokens=200)
    cluster.at(0.0015, {"type": "cancel", "rid": 1})  # queued (submitted at 1 ms)
    cluster.run(until_s=0.3)  # the others decode by now
    decoding = [rid for rid in (0, 2, 3) if len(cluster.tokens[rid]) > 1]
    assert decoding, "nothing decoding at 0.3 s"
    for rid in decoding:
        cluster.at(cluster.now_s, {"type": "cancel", "rid": rid})
    cluster.run()
    # queued: it leaves the queues (`ClusterCore.abandon`), no prefill runs for it
    assert cluster.done[1]["finish_reason"] == "abort" and len(cluster.tokens[1]) == 0
    assert 1 not in {i["rid"] for _, _, m in cluster.sent if m["type"] == "step" for i in m["items"]}
    for rid in decoding:
        assert cluster.done[rid]["finish_reason"] == "abort"
        assert 1 < len(cluster.tokens[rid]) < 200
    assert any(m["type"] == "decode_stop" for _, _, m in cluster.sent)
    _assert_all_freed(driver)


def test_done_info_carries_cached_tokens() -> None:
    driver = RuntimeDriver(small_config("dualpath"))
    cluster = FakeCluster(driver)
    cluster.submit_at(0.0, list(range(100)), 64, 3)
    cluster.run()
    done = next(m for _, dest, m in cluster.sent if dest == CLIENT and m["type"] == "done")
    assert done["cached_tokens"] == 64 and done["finish_reason"] == "length"
