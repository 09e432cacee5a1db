"""The twin's prediction side: the simulator set up as the runtime cluster, and the runtime costs it adds."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from dualpath.cli.main import main
from dualpath.cli.twin_tables import format_tables, plot_ttft
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.twin import load_calibration
from dualpath.twin.calibration import NO_FACTORS
from dualpath.twin.predict import RuntimeStepCosts, predict, sim_config, sim_hardware, twin_simulation
from dualpath.twin.validate import ModeResult, error_pct

CALIBRATION = Path(__file__).parent / "data" / "cal-cpu.toml"
TRACE = [[(150 + 40 * a, 5), (12, 4), (8, 3)] for a in range(6)]


@pytest.fixture(scope="module")
def cal():  # type: ignore[no-untyped-def]
    return load_calibration(CALIBRATION)


def _spec(**over: object) -> RuntimeClusterSpec:
    base: dict[str, object] = dict(snic_bytes_per_s=6e6, cnic_bytes_per_s=48e6)
    base.update(over)
    return RuntimeClusterSpec(**base)  # type: ignore[arg-type]


def test_hardware_takes_the_cluster_layout_and_the_measured_link_efficiency(cal) -> None:  # type: ignore[no-untyped-def]
    hw = sim_hardware(_spec(snic_bytes_per_s=12e6, dram_buffer_bytes=2**20), cal)
    assert hw.snic_bytes_per_s == pytest.approx(2 * cal.hardware.snic_bytes_per_s)  # calibrated at 6 MB/s
    assert hw.dram_buffer_bytes == 2**20 and hw.gpus_per_node == 1
    config = sim_config(_spec(block_tokens=32, num_decode_nodes=3), cal, "dualpath")
    assert config.cluster.scheduler.block_tokens == 32 and config.cluster.num_decode_nodes == 3
    assert config.cost_model is cal.cost_model


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle"])
def test_prediction_has_the_compared_metrics(cal, mode: str) -> None:  # type: ignore[no-untyped-def]
    metrics, outcome = predict(_spec(), cal, mode, TRACE)
    for key in ("jct_s", "ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "throughput_tok_s"):
        assert metrics[key] > 0 and math.isfinite(metrics[key]), key
    assert metrics["jct_s"] == max(a.end_s for a in outcome.agents)
    paths = metrics["read_path_bytes"]
    if mode in ("basic", "oracle"):  # oracle: the runtime's inline reads are counted on the PE's SNIC
        assert paths["pe_read"] > 0 and paths["de_read"] == 0
    elif mode == "dualpath":
        assert paths["pe_read"] > 0 and paths["de_read"] > 0
    # Persisted bytes exclude the store's per-block fixed time that rides on the persist path.
    written = sum(d["tx"] for d in metrics["snic_bytes"].values())
    assert written > 0 and all(d["tx"] >= 0 for d in metrics["snic_bytes"].values())


def test_a_forward_costs_its_items_computed_one_after_another(cal) -> None:  # type: ignore[no-untyped-def]
    # The PE runs one `prefill_layer` per item and layer (pe_executor._step): each item pays its weight
    # reads and call overheads, which the cost model's batched form shares across a batch.
    cluster = sim_config(_spec(), cal, "dualpath").cluster
    costs = RuntimeStepCosts(cal.cost_model, cal.overheads, NO_FACTORS, cluster, oracle=False)
    items = [(256, 16), (512, 8), (128, 40), (384, 12)]  # a hit round: small appends over cached rows
    compute_s = lambda batch: costs.prefill_step_s([batch], 0)[0] - costs.forward_fixed_s([batch])  # noqa: E731
    assert compute_s(items) == pytest.approx(sum(compute_s([item]) for item in items))
    assert compute_s(items) > 1.3 * cal.cost_model.prefill_step_s([items], 0)[0]
    assert costs.prefill_step_s([items], 0)[1] == pytest.approx(
        sum(cal.cost_model.prefill_step_s([[item]], 0)[1] for item in items)
    )


def _jct(cal, mode: str, spec: RuntimeClusterSpec | None = None, **overheads: float) -> float:  # type: ignore[no-untyped-def]
    cores = overheads.pop("host_cores", 2.0)
    sim = twin_simulation(sim_config(spec or _spec(), cal, mode), TRACE, seed=0,
                         overheads=dataclasses.replace(cal.overheads, **overheads), host_cores=cores)  # fmt: skip
    return sim.run().end_s


def test_store_commit_delays_persisted_requests(cal) -> None:  # type: ignore[no-untyped-def]
    # PipelinedWriter: the link streams on while blocks commit, so a persist is durable one commit
    # after its last byte; a round behind a persist waits for that commit at least once.
    assert _jct(cal, "basic", store_write_op_s=0.05) > _jct(cal, "basic", store_write_op_s=0.0) + 0.04


def test_engines_share_the_host_cores(cal) -> None:  # type: ignore[no-untyped-def]
    # Store writes off and a fast CNIC (the oracle PE's hit loopback): they would hide the compute on
    # this small trace's critical path.
    fast = _spec(cnic_bytes_per_s=48e9)
    one = _jct(cal, "oracle", fast, host_cores=1.0, store_write_op_s=0.0)
    assert one > 1.2 * _jct(cal, "oracle", fast, host_cores=64.0, store_write_op_s=0.0)


def test_other_jobs_cores_are_capacity_the_engines_do_not_get(cal) -> None:  # type: ignore[no-untyped-def]
    def jct(external_cores: float) -> float:
        sim = twin_simulation(sim_config(_spec(), cal, "oracle"), TRACE, seed=0, host_cores=2.0,
                             overheads=dataclasses.replace(cal.overheads, store_write_op_s=0.0),
                             external_cores=external_cores)  # fmt: skip
        return sim.run().end_s

    # Other jobs took 1.5 of 2 cores: ours run on half a core, far slower than on the whole host.
    assert jct(1.5) > 1.6 * jct(0.0)
    assert jct(0.5) >= jct(0.0)
    assert jct(5.0) == jct(1.75)  # past the floor (a quarter core) more load changes nothing


def test_oracle_store_writes_hold_the_next_round(cal) -> None:  # type: ignore[no-untyped-def]
    """Oracle persists (the core's commands, unpaced) cost their commits: a round is done, and its agent's
    next round sent, only once its blocks are durable; its decode does not wait for them."""
    slow = twin_simulation(sim_config(_spec(), cal, "oracle"), TRACE, seed=0,
                          overheads=dataclasses.replace(cal.overheads, store_write_op_s=0.02), host_cores=2.0)  # fmt: skip
    out = slow.run()
    _, basic = predict(_spec(), cal, "basic", TRACE)
    hits = sum(r.hit_tokens for r in out.requests.values())
    assert hits == sum(r.hit_tokens for r in basic.requests.values())  # written before the next round
    fast = twin_simulation(sim_config(_spec(), cal, "oracle"), TRACE, seed=0,
                          overheads=dataclasses.replace(cal.overheads, store_write_op_s=0.0), host_cores=2.0)  # fmt: skip
    fast_out = fast.run()
    wait_s = [r.done_s - r.last_token_s for r in out.requests.values()]
    fast_wait_s = [r.done_s - r.last_token_s for r in fast_out.requests.values()]
    assert max(wait_s) >= 0.02 > max(fast_wait_s)  # at least one commit between last token and done
    assert out.end_s > fast_out.end_s


def test_tables_json_and_plot(cal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    predicted, _ = predict(_spec(), cal, "basic", TRACE)
    measured = {**predicted, "jct_s": predicted["jct_s"] * 2}
    result = ModeResult(mode="basic", measured=measured, predicted=predicted)
    assert result.error_pct()["jct_s"] == pytest.approx(-50.0)
    assert result.error_pct()["ttft_mean_s"] == pytest.approx(0.0)
    doc = result.to_dict()
    assert "ttft_series" not in doc["measured"] and json.dumps(doc)
    assert "jct_s" in format_tables({"basic": result})
    plot_ttft({"basic": result}, tmp_path / "ttft.png")
    assert (tmp_path / "ttft.png").stat().st_size > 1000
    assert error_pct(0.0, 1.0) is None and error_pct(2.0, 1.0) == pytest.approx(-50.0)


def test_repeats_compare_the_means_and_keep_each_run(cal, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import dualpath.twin.validate as validate_module
    from dualpath.runtime.bench import BenchOptions

    base, _ = predict(
        _spec(),
        cal,
        "oracle",
        [list(r) for r in validate_module.trace_rounds(BenchOptions(agents=2, max_rounds=2))],
    )
    jcts = iter([3.0, 5.0])

    def fake_measure(mode: str, options: object, **_: object) -> dict:  # type: ignore[type-arg]
        return {**base, "jct_s": next(jcts), "external_cores": 0.0, "scheduler_rates": {}}

    monkeypatch.setattr(validate_module, "measure_mode", fake_measure)
    out = validate_module.validate(_spec(), cal, BenchOptions(agents=2, max_rounds=2), ["oracle"], config="local-1p2d",
                                   repeats=2)["oracle"]  # fmt: skip
    assert [r["measured"]["jct_s"] for r in out.runs] == [3.0, 5.0]
    assert out.measured["jct_s"] == pytest.approx(4.0)
    assert out.predicted["jct_s"] == pytest.approx(out.runs[0]["predicted"]["jct_s"])  # same inputs twice
    assert len(out.measured["ttft_series"]) == 2 * len(base["ttft_series"])  # both runs' points
    assert "mean of 2 runs" in format_tables({"oracle": out}) and json.dumps(out.to_dict())


@pytest.mark.parametrize(
    "argv",
    [
        ["--modes", "basic,nope"],
        ["--calibration", "/no/such.toml"],
        ["--agents", "0"],
        ["--repeat", "0"],
        ["--config", "no-such"],
        ["--set", "snic_bytes_per_s=-1"],
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *argv]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _cache(folder: Path, **changes: object) -> Path:
    """A demo cache: the test calibration with in-situ factors and a recorded speed probe (1 ms)."""
    from dualpath.twin import write_calibration

    in_situ = {"basic": {"pe_engine": 1.5, "background_cores": 0.3, "pe_stall_s": 0.02}}
    base = load_calibration(CALIBRATION)
    fields = {"runtime_cpu": in_situ, "meta": {**base.meta, "probe_cpu_s": 1e-3}, **changes}
    path = folder / "calibration-local-1p2d.toml"
    write_calibration(dataclasses.replace(base, **fields), path)  # type: ignore[arg-type]
    return path


def test_demo_rows_get_predictions_from_a_cached_calibration(cal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from dualpath.cli.demo_twin import add_predictions, cached_calibration, format_predictions
    from dualpath.runtime.bench import BenchOptions

    _cache(tmp_path)
    said: list[str] = []
    cached = cached_calibration("local-1p2d", folder=tmp_path, say=said.append, probe=lambda: 1.2e-3)
    assert said == [] and cached.hardware == cal.hardware  # read from the cache, nothing measured
    assert cached.runtime_cpu == {"basic": {"pe_engine": 1.5, "background_cores": 0.3, "pe_stall_s": 0.02}}
    rows = [{"mode": m, "jct_s": 2.0, "ttft_mean_s": 0.2} for m in ("basic", "oracle")]
    add_predictions(rows, cached, "local-1p2d", BenchOptions(agents=3, max_rounds=2))
    assert rows[0]["predicted_jct_s"] > rows[1]["predicted_jct_s"] > 0
    assert rows[0]["jct_s_error_pct"] == pytest.approx(100 * (rows[0]["predicted_jct_s"] / 2.0 - 1))
    assert "sim JCT" in format_predictions(rows)


def _measured_again(monkeypatch: pytest.MonkeyPatch, fresh: object) -> None:
    import importlib

    calibrate_module = importlib.import_module("dualpath.twin.calibrate")  # the module, not the function
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *a, **k: fresh)


def test_a_cached_calibration_without_in_situ_factors_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from dualpath.cli.demo_twin import cached_calibration

    fresh = dataclasses.replace(
        load_calibration(CALIBRATION), runtime_cpu={"oracle": {"pe_engine": 2.0, "pe_stall_s": 0.03}}
    )
    _measured_again(monkeypatch, fresh)
    (tmp_path / "calibration-local-1p2d.toml").write_text(CALIBRATION.read_text())  # an old cache
    said: list[str] = []
    got = cached_calibration("local-1p2d", folder=tmp_path, say=said.append, probe=lambda: 1e-3)
    assert got.runtime_cpu == fresh.runtime_cpu
    assert len(said) == 1 and "calibrating" in said[0]
    written = load_calibration(tmp_path / "calibration-local-1p2d.toml")
    assert written.runtime_cpu == fresh.runtime_cpu
    assert written.meta["probe_cpu_s"] == pytest.approx(1e-3) and len(written.meta["load_average_1m"]) == 2
    # In-situ factors without the PE's stall (an older calibration): measured again too.
    monkeypatch.setattr(importlib.import_module("dualpath.twin.calibration"), "load_calibration",
                        lambda *a, **k: dataclasses.replace(fresh, runtime_cpu={"oracle": {"pe_engine": 2.0}}))  # fmt: skip
    cached_calibration("local-1p2d", folder=tmp_path, say=said.append, probe=lambda: 1e-3)
    assert len(said) == 2


def test_a_cached_calibration_is_measured_again_when_the_speed_probe_disagrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dualpath.cli.demo_twin import PROBE_TOLERANCE, cached_calibration

    fresh = dataclasses.replace(load_calibration(CALIBRATION), runtime_cpu={"oracle": {"pe_stall_s": 0.03}})
    _measured_again(monkeypatch, fresh)
    _cache(tmp_path)  # recorded at a probe of 1 ms
    said: list[str] = []
    within = 1e-3 * (1 + 0.9 * PROBE_TOLERANCE)
    assert (
        cached_calibration("local-1p2d", folder=tmp_path, say=said.append, probe=lambda: within).runtime_cpu
        != fresh.runtime_cpu
    )
    assert said == []
    slower = 1e-3 * (1 + 1.5 * PROBE_TOLERANCE)
    assert (
        cached_calibration("local-1p2d", folder=tmp_path, say=said.append, probe=lambda: slower).runtime_cpu
        == fresh.runtime_cpu
    )
    assert len(said) == 1 and "speed probe" in said[0]
    assert load_calibration(tmp_path / "calibration-local-1p2d.toml").meta["probe_cpu_s"] == pytest.approx(
        slower
    )


def test_online_arrivals_are_the_load_generators(cal) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    from dualpath.runtime.loadgen import poisson_starts

    sim = twin_simulation(sim_config(_spec(), cal, "dualpath", aps=3.0), TRACE, seed=7,
                         overheads=cal.overheads, host_cores=2.0)  # fmt: skip
    want = poisson_starts(len(TRACE), 3.0, np.random.default_rng([7, 1]))
    assert [a.start_s for a in sim.agents] == want and want[0] > 0
