"""One policy, two drivers: the runtime's `RuntimeDriver` and the simulator make the same decisions.

The simulator runs a small trace with the twin's set-up (a calibrated CPU cost model, the runtime's α, β
and §6.4 predictor, its decode run length). Every completion its physics produces (a read done, a
forward done, KV out, H2D, a persist, a decode run, a group fetch) is recorded at its virtual time and
fed, as the node event the runtime would send, into a fresh `RuntimeDriver`: the sim is the driver's
null byte mover and clock. The only code that differs between the two runs is the driver's (message
building, split reads, done/release), and these must agree:

- the decision logs (every assignment and batch);
- the fetch cadence: the driver wants a fetch exactly at the sim's fetches (`ClusterCore.wants_fetch`);
- decode runs: the driver sends a run of the sim's length to the same DE, and a `decode_cut` for each run
  the sim cut for a joiner (`start_decode_run`, `decode_cut_wanted`);
- persists, oracle included: the driver sends the persists whose completions the sim reports;
- a lost block: one read reports fewer usable tokens in both (`on_read_done(..., usable_tokens)`).

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
        self.runs: list[tuple[str, str, int]] = []  # ("run", DE node, steps) and ("cut", DE node, 0)
        self._cut: dict[int, bool] = {}
        self.lost_read: tuple[int, int] | None = None  # (rid, usable tokens) of the read that lost a block

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
        """The first read of a long hit loses its last blocks but one (`LOST_BLOCK_RID`)."""
        event = {"type": "read_done", "node": self._names[node_id], "rid": request_id}
        usable = None
        if request_id == LOST_BLOCK_RID and self.lost_read is None:
            part = self._core.readers[node_id].in_flight(request_id)
            assert part is not None
            usable = part.tokens // 2
            usable -= usable % 16
            self.lost_read = (request_id, usable)
            event["usable_tokens"] = usable
        self.events.append((now_s, event))
        return self._core.on_read_done(node_id, request_id, now_s, usable)

    def start_decode_run(self, node_id: int) -> int:
        steps = self._core.start_decode_run(node_id)
        if steps:
            self.runs.append(("run", self._names[node_id], steps))
            self._cut[node_id] = False
        return steps

    def decode_cut_wanted(self, node_id: int) -> bool:
        wanted = self._core.decode_cut_wanted(node_id)
        if wanted and not self._cut.get(node_id):
            self.runs.append(("cut", self._names[node_id], 0))
            self._cut[node_id] = True
        return wanted

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
        # A run's end, as the runtime's DE reports it: the steps it ran (fewer than given when cut).
        self.events.append((now_s, {"type": "decode_done", "node": self._names[node_id], "steps": steps}))
        return self._core.advance_decode(node_id, steps, now_s)


def _spec() -> RuntimeClusterSpec:
    return RuntimeClusterSpec(num_prefill_nodes=1, num_decode_nodes=2, snic_bytes_per_s=6e6,
                              cnic_bytes_per_s=48e6, hbm_tokens=65536)  # fmt: skip


def _trace() -> list[list[tuple[int, int]]]:
    """Six agents, three rounds: concurrent reads on both sides, long first prompts that get chunked,
    outputs long enough to fill blocks and to outlast a decode run (joiners cut runs)."""
    return [[(120 + 90 * a, 4 + a), (20 + 7 * a, 3 + 9 * (a % 2)), (9, 2 + a % 3)] for a in range(6)]


# Agent 5's second round (request 11, hit of 528 tokens) loses the back half of its first read's blocks.
LOST_BLOCK_RID = 11


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
    config = replace(config, keep_decisions=True)  # the decisions are what the parent compares
    if fail:
        config = replace(config, failures=FAILURES)
    sim = Simulation(config, _trace(), seed=0)
    recorder = RecordingCore(sim.core, sim, [name for name, _ in spec.node_ids()])
    sim.core = recorder  # type: ignore[assignment]
    sim.run()
    return {
        "rounds": [a.next_round for a in sim.agents],
        "events": recorder.events,
        "runs": recorder.runs,
        "lost_read": recorder.lost_read,
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


class Drive:
    """The recorded events through a fresh `RuntimeDriver`; what it sent, and whether it agreed on when to
    fetch (a recorded fetch finds `wants_fetch` true; no instant ends with a fetch still due)."""

    def __init__(self, mode: str, events: list[tuple[float, dict[str, Any]]]) -> None:
        self.driver = driver = RuntimeDriver(_driver_config(_spec(), mode))
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.fetch_disagreements: list[tuple[float, str]] = []
        last_s = 0.0
        for now_s, event in events:
            if now_s > last_s and driver.wants_fetch:
                self.fetch_disagreements.append((last_s, "driver wanted a fetch the sim did not make"))
            last_s = now_s
            if event["type"] == "fetch" and not driver.wants_fetch:
                self.fetch_disagreements.append((now_s, "sim fetched, driver wanted none"))
            self.sent += self._feed(now_s, event)

    def _feed(self, now_s: float, event: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        driver = self.driver
        if event["type"] == "submit":
            ids = [(7 * len(driver.event_log) + k) % 250 for k in range(event["prompt_tokens"])]
            _, out = driver.submit(
                token_ids=ids, hit_tokens=event["hit_tokens"], max_tokens=event["max_tokens"], now_s=now_s
            )
            return out
        if event["type"] == "decode_done":
            batch = driver.core.decode_batch(driver.node_id(event["node"]))
            return driver.handle({**event, "tokens": [[rid, [1] * event["steps"]] for rid in batch]}, now_s)
        if event["type"] == "step_done":
            return driver.handle({**event, "first_tokens": []}, now_s)
        return driver.handle(event, now_s)  # node_down / node_up: `replan`s come back as the sim's submits

    def runs(self) -> list[tuple[str, str, int]]:
        """Decode runs and cuts as the sim's recorder lists them."""
        return [("run", dest, m["steps"]) if m["type"] == "decode_step" else ("cut", dest, 0)
                for dest, m in self.sent if m["type"] in ("decode_step", "decode_cut")]  # fmt: skip


def _drive(mode: str, events: list[tuple[float, dict[str, Any]]]) -> RuntimeDriver:
    return Drive(mode, events).driver


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
def test_runtime_driver_makes_the_simulators_decisions(mode: str) -> None:
    sim = _simulate(mode)
    assert sim["rounds"] == [3] * 6  # every round ran
    drive = Drive(mode, sim["events"])
    driver = drive.driver
    want, got = sim["decisions"], _reprs(driver.log.per_engine())
    assert len(want["assign"]) == 18
    assert sim["batched"]  # real batching
    assert got == want
    assert driver.active_requests == 0  # every request finished through the driver too
    if mode == "dualpath":  # both read sides chosen: the split-read translation was exercised
        assert len(sim["sides"]) == 2
    # The fetch cadence is the core's: both drivers fetch at the same instants.
    assert drive.fetch_disagreements == []
    # Decode runs: the same lengths on the same DEs, the same cuts; runs of several steps and cuts occur.
    runs = [tuple(r) for r in sim["runs"]]
    assert drive.runs() == runs
    assert any(n > 1 for kind, _, n in runs if kind == "run") and ("cut" in {k for k, _, _ in runs})
    # Persists, oracle's too: the driver sent exactly the writes whose completions the sim reported.
    sent = sorted((m["rid"], m["from_hbm"]) for _, m in drive.sent if m["type"] == "persist")
    done = sorted((e["rid"], e["from_hbm"]) for _, e in sim["events"] if e["type"] == "persist_done")
    assert sent == done and any(from_hbm for _, from_hbm in sent)


@pytest.mark.parametrize("mode", ["basic", "dualpath"])
def test_a_lost_block_shrinks_the_hit_in_both_drivers(mode: str) -> None:
    """One read reports fewer usable tokens (a corrupt block; in the sim the recorder says so): the core
    computes the lost tokens in both drivers (same batches), and writes them again from the usable hit."""
    sim = _simulate(mode)
    rid, usable = sim["lost_read"]
    drive = Drive(mode, sim["events"])
    assert _reprs(drive.driver.log.per_engine()) == sim["decisions"]
    items = [b for b in drive.driver.log.batches for b in b.items if b.request_id == rid]
    assert items[0].cached_tokens == usable  # the first chunk computes from the usable hit
    prompt = [m for _, m in drive.sent if m["type"] == "persist" and m["rid"] == rid and not m["from_hbm"]]
    assert prompt[0]["start_tokens"] == usable


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
    decisions differ, or it is told of a read or a decode run it never started)."""
    sim = _simulate("dualpath")
    try:
        diverged = _reprs(_drive("dualpath-rr", sim["events"]).log.per_engine()) != sim["decisions"]
    except (KeyError, AssertionError):
        diverged = True
    assert diverged


if __name__ == "__main__":  # the child of `_simulate`
    print(json.dumps(_simulate_here(sys.argv[1], fail=sys.argv[2:] == ["fail"])))
