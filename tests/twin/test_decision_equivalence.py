"""One policy, two drivers: the runtime's `RuntimeDriver` and the simulator make the same decisions.

The simulator runs a small trace with the twin's set-up (a calibrated CPU cost model, the runtime's α, β
and §6.4 predictor). Every completion its physics produces (a read done, a forward done, KV out, H2D,
a persist, decode steps, a group fetch) is recorded at its virtual time and fed, as the node event the
runtime would send, into a fresh `RuntimeDriver`: the sim is the driver's null byte mover and clock. The
only code that differs between the two runs is the driver's (message building, split reads, one decode
step per event, done/release), and the decision logs must be identical.

The simulator side runs in a child process on the pure-Python source (`DUALPATH_PURE_PYTHON=1`): the
compiled `Simulation` type-checks its `core` attribute, so only the interpreted one takes the recorder.
Decisions cross back as their reprs (the same dataclass reprs in both builds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dualpath.engine.core import ClusterCore
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.runtime.driver import DriverConfig, RuntimeDriver
from dualpath.sim.driver import Simulation
from dualpath.twin import load_calibration
from dualpath.twin.predict import runtime_predictor_terms, sim_config

CALIBRATION = Path(__file__).parent / "data" / "cal-cpu.toml"


class RecordingCore:
    """Forwards to the sim's `ClusterCore`; records each completion call as a runtime node event."""

    def __init__(self, core: ClusterCore, sim: Simulation, names: list[str]) -> None:
        self._core, self._sim, self._names = core, sim, names
        self.events: list[tuple[float, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def _now(self) -> float:
        return self._sim.sim.now_s

    def submit(self, request: Any, now_s: float) -> Any:
        body = {"type": "submit", "prompt_tokens": request.prompt_tokens, "hit_tokens": request.hit_tokens,
                "max_tokens": request.gen_tokens}  # fmt: skip
        self.events.append((now_s, body))
        return self._core.submit(request, now_s)

    def fetch(self, now_s: float) -> Any:
        self.events.append((now_s, {"type": "fetch"}))
        return self._core.fetch(now_s)

    def on_read_done(self, node_id: int, request_id: int, now_s: float) -> Any:
        self.events.append((now_s, {"type": "read_done", "node": self._names[node_id], "rid": request_id}))
        return self._core.on_read_done(node_id, request_id, now_s)

    def on_prefill_step_done(self, node_id: int, step_id: int, now_s: float) -> Any:
        self.events.append((now_s, {"type": "step_done", "node": self._names[node_id], "step_id": step_id}))
        return self._core.on_prefill_step_done(node_id, step_id, now_s)

    def on_kv_out_done(self, node_id: int, step_id: int, now_s: float) -> Any:
        self.events.append((now_s, {"type": "kv_out_done", "node": self._names[node_id], "step_id": step_id}))
        return self._core.on_kv_out_done(node_id, step_id, now_s)

    def on_h2d_done(self, request_id: int, now_s: float) -> Any:
        self.events.append((now_s, {"type": "h2d_done", "rid": request_id}))
        return self._core.on_h2d_done(request_id, now_s)

    def on_persist_done(self, request_id: int, from_hbm: bool, now_s: float) -> Any:
        self.events.append((now_s, {"type": "persist_done", "rid": request_id, "from_hbm": from_hbm}))
        return self._core.on_persist_done(request_id, from_hbm, now_s)

    def on_node_down(self, node_id: int) -> Any:
        self.events.append((self._now(), {"type": "node_down", "node": self._names[node_id]}))
        return self._core.on_node_down(node_id)

    def on_node_up(self, node_id: int) -> Any:
        self.events.append((self._now(), {"type": "node_up", "node": self._names[node_id]}))
        return self._core.on_node_up(node_id)

    def advance_decode(self, node_id: int, steps: int, now_s: float) -> Any:
        # The sim advances a run of steps at once; the runtime's DE reports every step.
        for _ in range(steps):
            self.events.append((now_s, {"type": "decode_done", "node": self._names[node_id]}))
        return self._core.advance_decode(node_id, steps, now_s)


def _spec() -> RuntimeClusterSpec:
    return RuntimeClusterSpec(num_prefill_nodes=1, num_decode_nodes=2, snic_bytes_per_s=6e6,
                              cnic_bytes_per_s=48e6, hbm_tokens=65536)  # fmt: skip


def _trace() -> list[list[tuple[int, int]]]:
    """Six agents, three rounds: concurrent reads on both sides, long first prompts that get chunked."""
    return [[(120 + 90 * a, 4 + a), (20 + 7 * a, 3), (9, 2 + a % 3)] for a in range(6)]


def _driver_config(spec: RuntimeClusterSpec, mode: str) -> DriverConfig:
    cal = load_calibration(CALIBRATION)
    prefill_tokens_per_s, pair_s = runtime_predictor_terms(cal.cost_model)
    from dualpath.architecture import arch

    return DriverConfig(
        node_names=tuple(name for name, _ in spec.node_ids()),
        num_prefill_nodes=spec.num_prefill_nodes,
        engines_per_node=spec.engines_per_node,
        mode=mode,
        read_path=spec.read_path or None,
        block_tokens=spec.block_tokens,
        kv_bytes_per_token=float(arch.kv_bytes_per_token(cal.model)),
        dram_buffer_bytes=float(spec.dram_buffer_bytes),
        de_hbm_kv_tokens=spec.hbm_tokens,
        pe_hbm_kv_tokens=spec.hbm_tokens,
        snic_bytes_per_s=spec.snic_bytes_per_s,
        prefill_tokens_per_s=prefill_tokens_per_s,
        attention_s_per_token_pair=pair_s,
    )


# d1 dies mid-run and joins again 0.4 s later, then p0 (the only PE) dies for 0.3 s: requests wait for it
# (node ids: p0 = 0, d0 = 1, d1 = 2; times s inside the trace's busy stretch).
FAILURES = ((2, 0.35, 0.4), (0, 0.9, 0.3))


def _simulate_here(mode: str, fail: bool = False) -> dict[str, Any]:
    """Run the trace in this process (the child's side): what the parent compares."""
    from dataclasses import replace

    spec = _spec()
    config = sim_config(spec, load_calibration(CALIBRATION), mode)
    if fail:
        config = replace(config, failures=FAILURES)
    sim = Simulation(config, _trace(), seed=0)
    recorder = RecordingCore(sim.core, sim, [name for name, _ in spec.node_ids()])
    sim.core = recorder  # type: ignore[assignment]
    sim.run()
    return {
        "rounds": [a.next_round for a in sim.agents],
        "events": recorder.events,
        "decisions": _reprs(sim.log.per_engine()),
        "sides": sorted({a.side.name for a in sim.log.assignments if a.pe_read_tokens + a.de_read_tokens}),
        "batched": any(len(b.items) > 1 for b in sim.log.batches if b.pe_engine == 0),
        "replanned": sum(k for _, _, k in sim.failure_log),
    }


def _simulate(mode: str, fail: bool = False) -> dict[str, Any]:
    """`_simulate_here` in a child process on the pure-Python simulator (module docstring)."""
    env = {**os.environ, "DUALPATH_PURE_PYTHON": "1"}
    done = subprocess.run(
        [sys.executable, __file__, mode, *(["fail"] if fail else [])], env=env, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    out: dict[str, Any] = json.loads(done.stdout)
    out["events"] = [(now_s, body) for now_s, body in out["events"]]
    return out


def _reprs(per_engine: dict[str, list[Any]]) -> dict[str, list[str]]:
    return {stream: [repr(d) for d in decisions] for stream, decisions in per_engine.items()}


def _drive(mode: str, events: list[tuple[float, dict[str, Any]]]) -> RuntimeDriver:
    driver = RuntimeDriver(_driver_config(_spec(), mode))
    for now_s, event in events:
        if event["type"] == "submit":
            ids = [(7 * len(driver.event_log) + k) % 250 for k in range(event["prompt_tokens"])]
            driver.submit(
                token_ids=ids, hit_tokens=event["hit_tokens"], max_tokens=event["max_tokens"], now_s=now_s
            )
        elif event["type"] == "decode_done":
            node = event["node"]
            batch = [r.request_id for r in driver._batch[driver.node_id(node)]]  # noqa: SLF001
            driver.handle({**event, "tokens": [[rid, 1] for rid in batch]}, now_s)
        elif event["type"] in ("node_down", "node_up"):
            driver.handle(event, now_s)  # its `replan`s come back as the sim's continuation submits
        elif event["type"] == "step_done":
            driver.handle({**event, "first_tokens": []}, now_s)
        else:
            driver.handle(event, now_s)
    return driver


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
def test_runtime_driver_makes_the_simulators_decisions(mode: str) -> None:
    sim = _simulate(mode)
    assert sim["rounds"] == [3] * 6  # every round ran
    driver = _drive(mode, sim["events"])
    want, got = sim["decisions"], _reprs(driver.log.per_engine())
    assert len(want["assign"]) == 18
    assert sim["batched"]  # real batching
    assert got == want
    assert driver.active_requests == 0  # every request finished through the driver too
    if mode == "dualpath":  # both read sides chosen: the split-read translation was exercised
        assert len(sim["sides"]) == 2


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
def test_the_same_decisions_through_node_failures(mode: str) -> None:
    """A DE dies mid-decode and rejoins, then the PE dies and rejoins: both drivers re-plan the same
    requests through `ClusterCore.on_node_down`, and every decision after matches too."""
    sim = _simulate(mode, fail=True)
    assert sim["rounds"] == [3] * 6 and sim["replanned"] > 0
    driver = _drive(mode, sim["events"])
    assert _reprs(driver.log.per_engine()) == sim["decisions"]
    assert driver.active_requests == 0


def test_a_different_policy_is_caught() -> None:
    """The comparison is sharp: the same events through a round-robin-read-path driver diverge (its
    decisions differ, or it is told of a read it never started)."""
    sim = _simulate("dualpath")
    try:
        diverged = _reprs(_drive("dualpath-rr", sim["events"]).log.per_engine()) != sim["decisions"]
    except KeyError:
        diverged = True
    assert diverged


if __name__ == "__main__":  # the child of `_simulate`
    print(json.dumps(_simulate_here(sys.argv[1], fail=sys.argv[2:] == ["fail"])))
