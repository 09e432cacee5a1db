"""A node that dies under load (issue 20 rows 4-5): the core re-plans its requests, each continues from
the tokens its client already has, and the surviving nodes' books stay exact (`RuntimeDriver` on a
virtual clock, `ClusterCore.on_node_down`)."""

from __future__ import annotations

import heapq
from typing import Any

import pytest
from fake_cluster import FakeCluster, small_config

from dualpath.runtime.driver import CLIENT, RuntimeDriver

MODES = ("basic", "dualpath-rr", "dualpath", "oracle")


class FailingCluster(FakeCluster):
    """Nodes can die (their messages vanish, their reports stop) and come back; a `replan` is
    submitted again as its continuation (prompt + tokens out, the rest of the budget), as
    `ClusterScheduler` does, under the same client id."""

    def __init__(self, driver: RuntimeDriver) -> None:
        super().__init__(driver)
        self.dead: set[str] = set()
        self.client_of: dict[int, int] = {}  # rid -> client id (a continuation keeps its client's)
        self.prompt: dict[int, list[int]] = {}
        self.budget: dict[int, int] = {}
        self.out: dict[int, list[int]] = {}
        self.finished: dict[int, dict[str, Any]] = {}
        self.drops: list[tuple[str, int]] = []

    def submit_client(self, t: float, client: int, prompt: list[int], max_tokens: int) -> None:
        self.prompt[client], self.budget[client], self.out[client] = prompt, max_tokens, []
        self.at(t, {"type": "@client", "client": client, "prompt": prompt, "max_tokens": max_tokens})

    def kill(self, t: float, node: str) -> None:
        self.at(t, {"type": "@kill", "node": node})

    def revive(self, t: float, node: str) -> None:
        self.at(t, {"type": "@revive", "node": node})

    def run(self, until_s: float = 1e6) -> None:
        while self._queue and self._queue[0][0] <= until_s:
            t, _, event = self._queue[0]
            if event["type"].startswith("@") and event["type"] != "@submit":
                heapq.heappop(self._queue)
                self.now_s = t
                self._special(event)
                continue
            if event.get("node") in self.dead:
                heapq.heappop(self._queue)  # a dead node reports nothing
                continue
            super().run(until_s=t)

    def _special(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "@client":
            self._submit(event["client"], event["prompt"], event["max_tokens"])
        elif kind == "@kill":
            self.dead.add(event["node"])
            self._queue[:] = [
                e for e in self._queue if e[2].get("node") != event["node"] or e[2]["type"].startswith("@")
            ]
            heapq.heapify(self._queue)
            self._dispatch(self.driver.handle({"type": "node_down", "node": event["node"]}, self.now_s))
        elif kind == "@revive":
            self.dead.discard(event["node"])
            self.runs.pop(event["node"], None)
            self._dispatch(self.driver.handle({"type": "node_up", "node": event["node"]}, self.now_s))
        if self.driver.wants_fetch:
            self.at(self.now_s, {"type": "fetch"})

    def _submit(self, client: int, prompt: list[int], max_tokens: int) -> None:
        rid, out = self.driver.submit(token_ids=prompt, hit_tokens=0, max_tokens=max_tokens, now_s=self.now_s)
        self.client_of[rid] = client
        self._dispatch(out)

    def _dispatch(self, out: list[tuple[str, dict[str, Any]]]) -> None:
        live: list[tuple[str, dict[str, Any]]] = []
        for dest, m in out:
            if dest == CLIENT:
                self.sent.append((self.now_s, dest, m))
                client = self.client_of[m["rid"]]
                if m["type"] == "tokens":
                    self.out[client] += m["token_ids"]
                elif m["type"] == "replan":
                    left = self.budget[client] - len(self.out[client])
                    self._submit(client, self.prompt[client] + self.out[client], left)
                else:
                    self.finished[client] = m
            elif m["type"] == "drop":
                self.drops.append((dest, m["rid"]))
            elif dest not in self.dead:
                live.append((dest, m))
        self.sent += [(self.now_s, dest, m) for dest, m in out if dest != CLIENT and dest in self.dead]
        super()._dispatch([(dest, m) for dest, m in live if dest != CLIENT])


def _clients(cluster: FailingCluster, n: int = 8) -> dict[int, int]:
    want = {}
    for i in range(n):
        prompt = [(5 * i + k) % 250 for k in range(48 + 40 * i)]
        want[i] = 20 + 3 * i
        cluster.submit_client(0.01 * i, i, prompt, want[i])
    return want


def _check_all_served(cluster: FailingCluster, want: dict[int, int]) -> None:
    assert sorted(cluster.finished) == sorted(want)
    for client, n in want.items():
        assert len(cluster.out[client]) == n, (client, len(cluster.out[client]), n)
    driver = cluster.driver
    assert driver.active_requests == 0 and driver.core.active_requests == 0
    driver.core.check_invariants()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("node", ["d0", "d1"])
def test_a_decode_node_dies_mid_decode_its_requests_continue_on_the_other(mode: str, node: str) -> None:
    cluster = FailingCluster(RuntimeDriver(small_config(mode)))
    want = _clients(cluster)
    cluster.kill(0.3, node)
    cluster.run()
    _check_all_served(cluster, want)
    assert any(m["type"] == "replan" for _, dest, m in cluster.sent if dest == CLIENT)
    de_after = {m["de"] for t, dest, m in cluster.sent if dest == CLIENT and m["type"] == "done" and t > 0.3}
    assert cluster.driver.core.node_of_engine(min(de_after)) != cluster.driver.node_id(node)


@pytest.mark.parametrize("mode", MODES)
def test_the_prefill_node_dies_requests_wait_for_it_and_finish_once_it_is_back(mode: str) -> None:
    cluster = FailingCluster(
        RuntimeDriver(small_config(mode, node_names=("p0", "p1", "d0"), num_prefill_nodes=2))
    )
    want = _clients(cluster)
    cluster.kill(0.02, "p0")
    cluster.run(until_s=5.0)
    _check_all_served(cluster, want)
    assert cluster.driver.core.nodes_up == (1, 1)


def test_a_lone_prefill_node_that_dies_leaves_no_pe_then_rejoins() -> None:
    cluster = FailingCluster(RuntimeDriver(small_config()))
    want = _clients(cluster)
    cluster.kill(0.02, "p0")
    cluster.run(until_s=1.0)
    assert cluster.driver.core.nodes_up == (0, 2)
    assert len(cluster.finished) < len(want)
    cluster.revive(1.0, "p0")
    cluster.run()
    _check_all_served(cluster, want)


def test_survivors_are_told_to_drop_what_they_hold_for_re_planned_requests() -> None:
    cluster = FailingCluster(RuntimeDriver(small_config()))
    _clients(cluster)
    cluster.kill(0.03, "p0")
    cluster.run(until_s=0.5)
    assert cluster.drops and {dest for dest, _ in cluster.drops} <= {"d0", "d1"}


def test_every_node_dying_in_turn_loses_no_request() -> None:
    cluster = FailingCluster(RuntimeDriver(small_config()))
    want = _clients(cluster, n=10)
    for k, node in enumerate(["d0", "p0", "d1", "d0", "p0"]):
        cluster.kill(0.05 + 0.2 * k, node)
        cluster.revive(0.12 + 0.2 * k, node)
    cluster.run()
    _check_all_served(cluster, want)
