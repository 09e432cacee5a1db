"""The runtime's own code paths that `dualpath calibrate` times (HTTP legs, PE forward Python, control CPU)
and where the twin charges them (sim/host.py, twin/predict.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import types
from pathlib import Path

import pytest
import torch

from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.runtime.model_host import build_model
from dualpath.twin import load_calibration
from dualpath.twin.calibrate import fit_measurements
from dualpath.twin.calibration_forward import forward_python_terms, measure_forward_python
from dualpath.twin.calibration_http import NullBackend, http_terms, measure_http
from dualpath.twin.predict import metrics_from_sim, predict, sim_config, twin_simulation

CALIBRATION = Path(__file__).parent / "data" / "cal-cpu.toml"
TRACE = [[(150 + 40 * a, 5), (12, 4), (8, 3)] for a in range(6)]


@pytest.fixture(scope="module")
def cal():  # type: ignore[no-untyped-def]
    return load_calibration(CALIBRATION)


def _spec() -> RuntimeClusterSpec:
    return RuntimeClusterSpec(snic_bytes_per_s=6e6, cnic_bytes_per_s=48e6)


def _run(cal, trace=TRACE, **overheads: float) -> dict:  # type: ignore[no-untyped-def]
    spec = _spec()
    sim = twin_simulation(sim_config(spec, cal, "oracle"), trace, seed=0, host_cores=2.0,
                         overheads=dataclasses.replace(cal.overheads, store_write_op_s=0.0, **overheads))  # fmt: skip
    return metrics_from_sim(sim.run(), spec)


def test_http_legs_against_the_real_api_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # this process's and the server's temporary folder
    monkeypatch.setattr(tempfile, "tempdir", None)  # read again from TMPDIR
    m = measure_http((16, 256), 3, lambda _: None, block_tokens=16)
    assert list(tmp_path.iterdir()) == []  # the no-op server's store folder is gone with it
    assert m["prompt_tokens"] == [16] * 3 + [256] * 3
    assert all(0 < t < 1.0 for t in m["first_chunk_s"])  # loopback, a no-op backend
    terms = http_terms(m)
    assert 0 < terms["http_leg_s"] < 0.5 and terms["http_leg_s_per_prompt_token"] >= 0
    assert terms["http_cpu_s"] >= 0 and terms["sse_chunk_cpu_s"] >= 0 and terms["sse_chunk_s"] > 0


def test_the_null_backend_hashes_the_prompt_in_the_calibrated_clusters_blocks() -> None:
    from dualpath.kvcache import block_keys

    class Store:
        def hit_blocks(self, keys: list) -> int:  # type: ignore[type-arg]
            self.keys = keys
            return 0

    prompt = list(range(40))
    for block_tokens in (8, 16):
        store = Store()
        request = types.SimpleNamespace(prompt_token_ids=prompt, max_tokens=2)

        async def drain() -> list:  # type: ignore[type-arg]
            return [chunk async for chunk in NullBackend(store, block_tokens).generate(request)]  # noqa: B023

        assert len(asyncio.run(drain())) == 2
        assert store.keys == block_keys(prompt, block_tokens) and len(store.keys) == 40 // block_tokens


def test_http_terms_fit_the_per_size_medians() -> None:
    m = {"prompt_tokens": [100, 100, 100, 1100, 1100, 1100], "first_chunk_s": [0.002, 0.003, 0.009, 0.004, 0.0045, 0.005],
         "cpu_prompt_tokens": [100, 1100], "cpu_per_request_s": [0.0012, 0.0022], "chunk_s": [1e-4, 2e-4, 3e-4],
         "cpu_per_chunk_s": 5e-5}  # fmt: skip
    t = http_terms(m)
    assert t["http_leg_s_per_prompt_token"] == pytest.approx(1.5e-6)  # (0.0045 - 0.003) / 1000
    assert t["http_leg_s"] == pytest.approx(0.003 - 1.5e-4)
    assert t["http_cpu_s_per_prompt_token"] == pytest.approx(1e-6)
    assert t["http_cpu_s"] == pytest.approx(0.0011)
    assert t["sse_chunk_s"] == pytest.approx(2e-4) and t["sse_chunk_cpu_s"] == 5e-5


def test_forward_python_is_the_forward_cpu_beyond_layers_and_head() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model("tiny-llama", device="cpu", seed=0)
        m = measure_forward_python(model, 1, lambda _: None)
    finally:
        torch.set_num_threads(threads)
    assert m["items"] == [1.0, 1.0, 4.0, 4.0] * 2 and m["layerwise"] == [1.0] * 4 + [0.0] * 4
    assert m["cached_tokens"] == [0.0, 512.0] * 4
    assert all(0 <= p < f for p, f in zip(m["python_s"], m["forward_cpu_s"], strict=True))
    line = forward_python_terms(
        {"items": [1, 1, 4, 4], "cached_tokens": [0, 100, 0, 100], "python_s": [0.002, 0.003, 0.005, 0.009]}
    )
    assert line["prefill_python_s_per_item"] == pytest.approx(0.001)
    assert line["prefill_python_s"] == pytest.approx(0.001)
    # (0.003 - 0.002) / 100 and (0.009 - 0.005) / 400: the median of 1e-5 and 1e-5
    assert line["prefill_python_s_per_cached_token"] == pytest.approx(1e-5)
    old = forward_python_terms({"items": [1, 4, 1, 4], "python_s": [0.002, 0.005, 0.002, 0.005]})
    assert old["prefill_python_s_per_cached_token"] == 0.0  # measured before cached rows were


def test_presets_without_the_runtime_path_terms_load_with_zero(cal) -> None:  # type: ignore[no-untyped-def]
    assert cal.overheads.http_leg_s == 0.0 and cal.overheads.control_cpu_s == 0.0
    m = dict(cal.measurements)
    m["control_cpu_s"] = 1e-4  # per round trip: two messages
    assert fit_measurements(cal.model, m).overheads.control_cpu_s == pytest.approx(5e-5)


def test_the_http_leg_is_in_every_ttft_and_delays_every_round(cal) -> None:  # type: ignore[no-untyped-def]
    # One agent alone: no queueing that a later arrival could shorten.
    base = _run(cal, TRACE[:1])
    legged = _run(cal, TRACE[:1], http_leg_s=0.05)
    # At least the bare leg (more where the cores are shared), on every request's TTFT.
    assert legged["ttft_mean_s"] >= base["ttft_mean_s"] + 0.05 - 1e-9
    assert legged["jct_s"] >= base["jct_s"] + 3 * 0.05 - 1e-9  # three rounds per agent


def test_our_own_cpu_work_shares_the_cores(cal) -> None:  # type: ignore[no-untyped-def]
    base = _run(cal)
    # Each request's API/client CPU and each control message is one more runnable thread while it lasts.
    busy = _run(cal, http_cpu_s=0.2, control_cpu_s=0.05)
    assert busy["jct_s"] > 1.1 * base["jct_s"]


def test_pe_python_work_lengthens_each_forward(cal) -> None:  # type: ignore[no-untyped-def]
    base = _run(cal)
    slow = _run(cal, prefill_python_s=0.02, prefill_python_s_per_item=0.01)
    assert slow["ttft_mean_s"] > base["ttft_mean_s"] + 0.03 - 1e-9


def test_oracle_pe_reads_its_hits_on_its_own_thread_and_pays_no_link_time(cal) -> None:  # type: ignore[no-untyped-def]
    spec = _spec()
    sim = twin_simulation(
        sim_config(spec, cal, "oracle"), TRACE, seed=0, host_cores=2.0, overheads=cal.overheads
    )
    bt = sim.cluster.scheduler.block_tokens
    storage = sim.cluster.hardware.storage_bytes_per_s
    read_s = sim.cost.oracle_pe_read_s([[(1024, 16)]])
    assert read_s == pytest.approx(1024 // bt * cal.overheads.store_read_op_s + 1024 * sim.kv_bytes / storage)
    assert sim.cost.oracle_pe_read_s([[(0, 16)]]) == 0.0  # no cached rows, nothing read
    # In oracle the runtime's nodes run unpaced links (runtime/node.py): a CNIC of any rate changes nothing.
    slow = dataclasses.replace(cal, hardware=dataclasses.replace(cal.hardware, cnic_bytes_per_s=1e3))
    assert predict(spec, slow, "oracle", TRACE)[0]["jct_s"] == predict(spec, cal, "oracle", TRACE)[0]["jct_s"]
    basic = twin_simulation(
        sim_config(spec, cal, "basic"), TRACE, seed=0, host_cores=2.0, overheads=cal.overheads
    )
    assert basic.cost.oracle_pe_read_s([[(1024, 16)]]) == 0.0  # the simulator moves those bytes itself


def test_persists_of_one_de_node_cross_its_snic_fifo_like_the_runtime_writer(cal, ran_in_pure_python) -> None:  # type: ignore[no-untyped-def]
    """runtime/persist.py paces one job at a time: the first job is durable after its own bytes, the
    second after both (plus one commit each), where a shared flow would finish them together."""
    if ran_in_pure_python:  # the test patches the driver's `_persisted`
        return
    from dualpath.engine.commands import StartPersist

    spec = _spec()
    op_s = 0.004
    sim = twin_simulation(sim_config(spec, cal, "basic"), TRACE, seed=0, host_cores=2.0,
                         overheads=dataclasses.replace(cal.overheads, store_write_op_s=op_s))  # fmt: skip
    durable: dict[int, float] = {}
    # The host delays the core's persist-done by one commit (op_s): record when it reaches the core.
    sim._persisted = lambda items, size: durable.update({items[0].request_id: sim.sim.now_s})  # type: ignore[method-assignment]
    de = sim.cluster.num_prefill_nodes * sim.cluster.hardware.gpus_per_node  # the first DE engine
    tokens = (64, 192)
    for rid, n in zip((10_000, 10_001), tokens, strict=True):  # at t = 0, before the trace persists
        sim._persist(StartPersist(de_engine=de, request_id=rid, start_tokens=0, tokens=n, from_hbm=False))
    link_s = [n * sim.kv_bytes / sim.cluster.hardware.snic_bytes_per_s for n in tokens]
    sim.sim.run(until_s=sum(link_s) + 2 * op_s)
    assert durable[10_000] == pytest.approx(link_s[0] + op_s, rel=1e-6)
    assert durable[10_001] == pytest.approx(link_s[0] + link_s[1] + op_s, rel=1e-6)
