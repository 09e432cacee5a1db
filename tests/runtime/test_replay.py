"""A real runtime run's driver event log, replayed into a fresh `RuntimeDriver`, reproduces its decisions."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from runtime_helpers import agent_rounds, make_cluster

from dualpath.runtime.driver import DriverConfig, RuntimeDriver


def _plain(value: object) -> object:
    return json.loads(json.dumps(value))


def test_replaying_a_served_event_log_reproduces_messages_and_decisions(tmp_path, reference):
    log_path = tmp_path / "events.json"
    cluster = make_cluster(tmp_path / "store", mode="dualpath", extra=("--event-log", str(log_path)))
    # Two agents at once: batches, reads and decode steps interleave.
    with cluster as server, ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(
                agent_rounds, reference, np.random.default_rng(a), rounds=3, append=40, gen=5, url=server.url
            )
            for a in range(2)
        ]
        rounds = [r for run in runs for r in run.result()]
    assert server.process.returncode == 0
    for prompt, tokens, _ in rounds:
        assert tokens == reference.generate(prompt, len(tokens))
    assert any(info["effective_hit_tokens"] > 0 for _, _, info in rounds)
    record = json.loads(log_path.read_text())
    config = DriverConfig(**{**record["config"], "node_names": tuple(record["config"]["node_names"])})
    events = [(now, event) for now, event in record["events"]]
    assert sum(e["type"] == "submit" for _, e in events) == 6
    assert {e["type"] for _, e in events} >= {
        "fetch",
        "read_done",
        "step_done",
        "decode_done",
        "persist_done",
    }

    replayed, out = RuntimeDriver.replay(config, events)

    # The served run also sent the messages of each HTTP arrival's fetch in the same order.
    assert _plain(out) == record["sent"]
    assert [repr(d) for d in replayed.log.entries] == record["decisions"]
    assert replayed.active_requests == 0
    replayed.core.check_invariants()
