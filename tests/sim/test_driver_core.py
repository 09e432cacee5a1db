"""The simulator driver: closed-form layerwise pipeline, determinism, bookkeeping."""

from __future__ import annotations

import json

import pytest

from dualpath.cli.main import main
from dualpath.config.loader import load_cluster
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation
from dualpath.sim.prefill_timing import layerwise_end_s, whole_kv_end_s
from dualpath.sim.summary import summarise


def test_layerwise_closed_form_takes_layers_plus_one_layer_times() -> None:
    layers, t = 30, 0.01
    # Loads of all layers finish at L·t; compute is L·t in total, t per layer.
    end = layerwise_end_s(
        start_s=0.0, load_done_s=layers * t, layers=layers, compute_s=layers * t, last_layer_s=t
    )
    assert end == pytest.approx((layers + 1) * t)
    assert whole_kv_end_s(load_done_s=layers * t, compute_s=layers * t) == pytest.approx(2 * layers * t)


def small_sim(mode: str, *, agents: int = 6, rounds: int = 25, seed: int = 1, **sets: str) -> Simulation:
    overrides = [f"{k}={v}" for k, v in sets.items()]
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=overrides)  # fmt: skip
    trajectories = [t[:rounds] for t in load_trajectories("64k", agents, seed)]
    return Simulation(SimConfig(cluster=cluster, mode=mode), trajectories, seed=seed)


def test_every_request_finishes_and_core_is_clean() -> None:
    sim = small_sim("dualpath")
    out = sim.run()
    assert all(a.end_s == a.end_s for a in out.agents)  # no NaN: every agent finished
    assert out.core.active_requests == 0
    out.core.check_invariants()
    assert all(
        r.first_token_s <= r.second_token_s <= r.last_token_s
        for r in out.requests.values()
        if r.gen_tokens > 2
    )
    # The storage path carried every hit token exactly once.
    read = sum(n.snic_rx.bytes_carried(out.end_s) for n in out.topology.nodes)
    hit = sum(r.hit_tokens for r in out.requests.values()) * sim.kv_bytes
    assert read == pytest.approx(hit, rel=1e-6)


def test_requests_are_kept_by_id_and_each_agent_moves_on_once() -> None:
    sim = small_sim("dualpath", agents=3, rounds=4)
    out = sim.run()
    # Ids 0..n-1 in the order the driver made them; the outcome maps each id to its own milestones.
    assert list(out.requests) == list(range(sim.num_requests)) == list(range(12))
    assert all(sim.request_times(i) is t for i, t in out.requests.items())
    assert sim.request_times(sim.num_requests) is None and sim.request_times(-1) is None
    assert [t.round_index for t in out.requests.values() if t.agent == 1] == [0, 1, 2, 3]
    # Each request hands its agent on once (done or re-planned): a second time is a bug, not a new round.
    with pytest.raises(KeyError, match="request 0 has no agent"):
        sim._pop_agent(0)


def test_decisions_are_kept_only_when_asked_with_the_same_results() -> None:
    """A run keeps no decisions unless `keep_decisions` (a 48P96D run's 7.8 M assignments); the summary
    reads only the log's read-token sums, so both runs give the same numbers."""
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1)
    trajectories = [t[:25] for t in load_trajectories("64k", 6, 1)]
    runs = {}
    for keep in (False, True):
        config = SimConfig(cluster=cluster, mode="dualpath", keep_decisions=keep)
        out = Simulation(config, trajectories, seed=1).run()
        runs[keep] = (out, summarise(out, offline=True, wall_s=0.0))
    (dropped, dropped_summary), (kept, kept_summary) = runs[False], runs[True]
    assert dropped.log.entries == [] and len(kept.log.assignments) == len(kept.requests) > 0
    assert any(b.items for b in kept.log.batches)
    pe = sum(a.pe_read_tokens for a in kept.log.assignments)
    de = sum(a.de_read_tokens for a in kept.log.assignments)
    assert dropped.log.read_tokens() == kept.log.read_tokens() == (pe, de) and de > 0
    assert dropped_summary == kept_summary
    # The assignment times stamped from each fetch's decisions are there either way.
    assert [(t.scheduled_s, t.pe_engine, t.de_engine) for t in dropped.requests.values()] == [
        (t.scheduled_s, t.pe_engine, t.de_engine) for t in kept.requests.values()
    ]


def run_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert (
        main(
            [
                "simulate",
                "--model",
                "ds-27b",
                "--p",
                "1",
                "--d",
                "1",
                "--agents",
                "3",
                "--json",
                "--quiet",
                *args,
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    result.pop("sim_wall_s")
    return result  # type: ignore[no-any-return]


def test_same_seed_same_json_different_seed_different(capsys: pytest.CaptureFixture[str]) -> None:
    a = run_cli("--seed", "3", "--set", "hardware.snic_bytes_per_s=100Gbps", capsys=capsys)
    b = run_cli("--seed", "3", "--set", "hardware.snic_bytes_per_s=100Gbps", capsys=capsys)
    c = run_cli("--seed", "4", "--set", "hardware.snic_bytes_per_s=100Gbps", capsys=capsys)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a != c
    for key in (
        "jct_s",
        "requests",
        "ttft_s",
        "ttst_s",
        "tpot_s",
        "slo_attainment",
        "snic_bytes",
        "snic_max_over_avg",
        "events",
    ):
        assert key in a


def test_bad_mode_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--mode", "fastest", "--quiet"]) == 2
    assert "unknown --mode" in capsys.readouterr().err


def test_output_dir_has_records_links_config_and_plots(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    run_cli("-o", str(tmp_path), capsys=capsys)
    for name in (
        "requests.jsonl",
        "links.csv",
        "config.json",
        "summary.json",
        "snic_utilisation.png",
        "ttft.png",
    ):
        assert (tmp_path / name).stat().st_size > 0


def test_offline_burst_of_first_rounds_spreads_over_prefill_nodes() -> None:
    # All agents start at once and their first rounds have no hits: pure GPU work. β bounds the miss
    # tokens per engine, so once one PE group is full the next group's leader takes the rest of Q.
    # (β over prompt tokens, calibrated on hit-heavy rounds, let node 1 take the whole burst.)
    cluster = load_cluster(hardware="hopper-8x400g", model="deepseek-v3.2", num_prefill_nodes=2,
                           num_decode_nodes=4, overrides=[])  # fmt: skip
    trajectories = load_trajectories("64k", 1024, 1)
    sim = Simulation(SimConfig(cluster=cluster, mode="dualpath", duration_s=0.5), trajectories, seed=1)
    sim.run()
    first_rounds = [t for t in sim.times.values() if t.round_index == 0 and t.pe_engine >= 0]
    per_node = {n: sum(1 for t in first_rounds if t.pe_engine // 8 == n) for n in (0, 1)}
    assert min(per_node.values()) >= 0.25 * len(first_rounds), per_node
    for engine in sim.core.pe_nodes[0].engines + sim.core.pe_nodes[1].engines:
        assert engine.compute_tok <= sim.rates.beta_tokens + max(t.prompt_tokens for t in first_rounds)


class _CheckedFetches(Simulation):
    """Checks the core's invariants after every group fetch (the DE groups a fetch skips among them)."""

    def _fetch(self) -> None:
        super()._fetch()
        self.core.check_invariants()


@pytest.mark.parametrize("mode", ["dualpath", "dualpath-rr"])
def test_fetches_keep_the_scheduler_views_of_skipped_de_groups_exact(
    mode: str, ran_in_pure_python: bool
) -> None:
    """A fetch skips the DE groups that would only report what the scheduler holds; after every fetch
    each skipped group's read queue and Σtok must equal the scheduler's (`check_de_views`)."""
    if ran_in_pure_python:  # `_CheckedFetches` subclasses the driver
        return
    cluster = load_cluster(hardware="hopper-8x400g", model="deepseek-v3.2", num_prefill_nodes=2,
                           num_decode_nodes=4, overrides=[])  # fmt: skip
    trajectories = [t[:6] for t in load_trajectories("64k", 96, 3)]
    sim = _CheckedFetches(SimConfig(cluster=cluster, mode=mode), trajectories, seed=3)
    out = sim.run()
    assert all(a.end_s == a.end_s for a in out.agents)
