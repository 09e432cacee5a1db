"""The in-situ part of calibration (twin/calibration_runtime.py) and how the twin uses it (twin/physics.py)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.runtime.os_thread import EngineWork, name_os_thread
from dualpath.runtime.prom import ServeMetrics, parse_decode_restarts, parse_engine_work
from dualpath.twin import load_calibration
from dualpath.twin.calibration import NO_FACTORS
from dualpath.twin.calibration_runtime import (
    MIN_EFFICIENCY,
    PIECE_KEYS,
    _thread_ticks,
    cpu_by_group,
    factors,
    fixed_point_step,
    pooled,
    twin_engine_work,
)
from dualpath.twin.predict import predict

CALIBRATION = Path(__file__).parent / "data" / "cal-cpu.toml"
TRACE = [[(150 + 40 * a, 5), (12, 4), (8, 3)] for a in range(6)]


def _measured(**over: float) -> dict[str, float]:
    base = {"pe_engine": 2.0, "pe_io": 0.3, "de_engine": 1.5, "de_io": 0.5, "serve": 0.9, "client": 0.4,
            "wall_s": 4.0, "decode_restarts": 10.0, "decode_restart_s": 0.05}  # fmt: skip
    return base | over


def test_factors_are_per_piece_ratios_a_background_and_the_mean_restart() -> None:
    charged = {"pe_engine": 1.0, "pe_io": 1.0, "de_engine": 1.0, "de_io": 1.0, "serve": 0.1, "client": 0.2}
    f = factors(_measured(), charged)
    assert f["pe_engine"] == 2.0 and f["de_engine"] == 1.5 and f["client"] == 2.0
    assert f["background_cores"] == pytest.approx((0.3 + 0.5 + 0.9 - 0.1) / 4.0)
    assert f["decode_restart_s"] == pytest.approx(0.005)
    none = factors(_measured(decode_restarts=0.0, wall_s=0.0), dict.fromkeys(charged, 0.0))
    # Where the runtime counted its engine pieces, a piece's factor takes their CPU and the engine
    # thread's CPU outside them (taking messages, releases) joins the background.
    pieces = factors(_measured(pe_engine_busy_cpu_s=1.5), charged)
    assert pieces["pe_engine"] == 1.5 and pieces["de_engine"] == 1.5
    assert pieces["background_cores"] == pytest.approx((0.3 + 0.5 + 0.9 - 0.1 + 0.5) / 4.0)
    # Nothing charged, no wall, no restart: the defaults (the DE's efficiency and the PE's stall come
    # from `fixed_point_step`).
    assert none == {k: v for k, v in NO_FACTORS.items() if k not in PIECE_KEYS.values()}


def test_replays_pool_by_sums_so_the_factors_weigh_each_replay_by_its_work() -> None:
    a = _measured(seed=1.0, prefill_tokens_per_s=4000.0, external_cores=0.2)
    b = _measured(pe_engine=6.0, wall_s=8.0, decode_restarts=30.0, decode_restart_s=0.25, seed=2.0,
                  prefill_tokens_per_s=8000.0, external_cores=0.6)  # fmt: skip
    both = pooled([a, b])
    assert both["pe_engine"] == 8.0 and both["wall_s"] == 12.0 and both["replays"] == 2.0
    assert both["prefill_tokens_per_s"] == 6000.0 and "seed" not in both
    assert both["external_cores"] == pytest.approx(0.4)  # a condition of the replays, not a sum
    charged = pooled([{"pe_engine": 1.0, "de_engine": 1.0, "serve": 0.1, "client": 0.2},
                      {"pe_engine": 2.0, "de_engine": 1.0, "serve": 0.1, "client": 0.2}])  # fmt: skip
    f = factors(both, charged)
    assert f["pe_engine"] == pytest.approx(8.0 / 3.0)  # (2 + 6) / (1 + 2), not the ratios' mean 2.5
    assert f["decode_restart_s"] == pytest.approx(0.3 / 40)


def test_the_twin_replays_a_training_run_with_the_other_jobs_cores_it_had() -> None:
    # Other jobs' load during a training replay is the machine's condition, as in validate: the twin
    # replays it with that capacity, so the fixed point does not absorb it (and validate count it twice).
    cal, spec = load_calibration(CALIBRATION), RuntimeClusterSpec(snic_bytes_per_s=6e6, cnic_bytes_per_s=48e6)
    twin = {
        e: twin_engine_work(spec, cal, "oracle", {"seed": 3.0, "external_cores": e}, {}) for e in (0.0, 1.0)
    }
    assert twin[1.0]["pe_engine_wall_s"] > 1.3 * twin[0.0]["pe_engine_wall_s"]
    assert twin[1.0]["pe_engine_busy_cpu_s"] == pytest.approx(twin[0.0]["pe_engine_busy_cpu_s"], rel=0.05)


def test_the_twin_runs_a_replay_at_the_cores_speed_its_probe_had() -> None:
    # The speed probe took twice the calibration's CPU time during this replay: the cores ran at half
    # speed, so every piece takes longer on the wall for the same CPU seconds at the calibration's speed.
    cal, spec = load_calibration(CALIBRATION), RuntimeClusterSpec(snic_bytes_per_s=6e6, cnic_bytes_per_s=48e6)
    factors_at_calibration = {"probe_cpu_s": 1e-3}
    twin = {
        p: twin_engine_work(spec, cal, "oracle", {"seed": 3.0, "probe_cpu_s": p}, factors_at_calibration)
        for p in (1e-3, 2e-3)
    }
    assert twin[2e-3]["pe_engine_wall_s"] > 1.6 * twin[1e-3]["pe_engine_wall_s"]
    assert twin[2e-3]["pe_engine_busy_cpu_s"] == pytest.approx(twin[1e-3]["pe_engine_busy_cpu_s"], rel=0.05)
    # Not measured on either side: the calibration's speed.
    unmeasured = twin_engine_work(spec, cal, "oracle", {"seed": 3.0, "probe_cpu_s": 2e-3}, {})
    assert unmeasured["pe_engine_wall_s"] == pytest.approx(twin[1e-3]["pe_engine_wall_s"])


def test_cpu_by_group_counts_what_each_thread_used_between_snapshots() -> None:
    before = {(1, 1): ("pe_engine", 100), (1, 2): ("pe_io", 10), (2, 2): ("serve", 5)}
    after = {(1, 1): ("pe_engine", 250), (1, 2): ("pe_io", 10), (2, 2): ("serve", 55), (3, 3): ("client", 20)}
    got = cpu_by_group(before, after)
    hz = os.sysconf("SC_CLK_TCK")
    assert got["pe_engine"] == pytest.approx(150 / hz) and got["serve"] == pytest.approx(50 / hz)
    assert got["client"] == pytest.approx(20 / hz) and got["pe_io"] == 0.0 and got["de_engine"] == 0.0


def test_an_engine_thread_is_known_by_its_os_name() -> None:
    seen: dict[int, str] = {}

    def engine() -> None:
        name_os_thread("de-decode")
        tid = threading.get_native_id()
        seen[tid] = _thread_ticks(os.getpid())[tid][0]

    t = threading.Thread(target=engine)
    t.start()
    t.join()
    assert list(seen.values()) == ["de-decode"]


def test_de_restart_counters_reach_the_metrics_page() -> None:
    metrics = ServeMetrics()
    metrics.observe_node("d0", {"decode_restarts": 4.0, "decode_restart_s": 0.02})
    metrics.observe_node("d1", {"decode_restarts": 1.0, "decode_restart_s": 0.01})
    metrics.observe_node("p0", {"snic_rx_bytes": 1.0})  # a PE reports none
    assert parse_decode_restarts(metrics.text().decode()) == (5.0, pytest.approx(0.03))


def test_engine_work_counts_pieces_wall_and_the_thread_cpu_and_reaches_the_metrics_page() -> None:
    work = EngineWork()
    with work.timed():
        deadline = time.thread_time() + 0.02
        while time.thread_time() < deadline:  # 20 ms of this thread's CPU
            pass
    with work.timed():
        time.sleep(0.03)  # waiting: wall, no CPU
        with work.waiting():
            time.sleep(0.05)  # a wait that is not the piece's (a store write it must see land)
    stats = work.stats()
    assert stats["engine_pieces"] == 2.0
    assert stats["engine_wall_s"] < stats["engine_cpu_s"] + 0.03 + 0.04
    assert 0.02 <= stats["engine_cpu_s"] < 0.03
    # The two clocks differ by microseconds (the busy piece's wall can read a hair under its CPU time).
    assert stats["engine_wall_s"] >= stats["engine_cpu_s"] + 0.03 - 0.001
    metrics = ServeMetrics()
    metrics.observe_node("p0", stats)
    metrics.observe_node("d0", {"engine_pieces": 3.0, "engine_wall_s": 0.5, "engine_cpu_s": 0.2})
    parsed = parse_engine_work(metrics.text().decode())
    assert parsed["d0"] == (3.0, 0.5, 0.2)
    assert parsed["p0"] == (2.0, pytest.approx(stats["engine_wall_s"]), pytest.approx(stats["engine_cpu_s"]))


def test_the_fixed_point_steps_the_de_efficiency_the_pe_stall_and_the_piece_factors() -> None:
    measured = {"pe_engine_wall_s": 4.0, "pe_engine_busy_cpu_s": 2.0, "de_engine_wall_s": 4.0,
                "de_engine_busy_cpu_s": 2.0}  # fmt: skip
    # The twin's decode runs took 1.5 wall per CPU second against the runtime's 2: they run at 0.75.
    # Its 10 forwards took 3 s of wall against the runtime's 4: each stalls 0.1 s more.
    twin = {"pe_engine_pieces": 10.0, "pe_engine_wall_s": 3.0, "pe_engine_busy_cpu_s": 2.0,
            "de_engine_wall_s": 3.0, "de_engine_busy_cpu_s": 2.0}  # fmt: skip
    assert fixed_point_step(measured, twin) == {
        "de_efficiency": pytest.approx(0.75),
        "pe_stall_s": pytest.approx(0.1),
    }
    # A twin that already ran at 0.8 and a 0.05 s stall and still lacked as much: 0.8 x 0.75 and 0.15 s.
    step = fixed_point_step(measured, twin | {"de_efficiency": 0.8, "pe_stall_s": 0.05})
    assert step == {"de_efficiency": pytest.approx(0.6), "pe_stall_s": pytest.approx(0.15)}
    assert fixed_point_step(measured, twin | {"de_efficiency": 0.01})["de_efficiency"] == MIN_EFFICIENCY
    # Forwards longer than the runtime's: the stall shrinks, never below 0.
    assert (
        fixed_point_step(measured, twin | {"pe_engine_wall_s": 4.5, "pe_stall_s": 0.02})["pe_stall_s"] == 0.0
    )
    # A per-piece factor the twin ran with: times the runtime's CPU in the pieces over the twin's.
    step = fixed_point_step(measured, twin | {"pe_engine": 1.2, "pe_engine_busy_cpu_s": 1.6})
    assert step["pe_engine"] == pytest.approx(1.2 * 2.0 / 1.6) and "de_engine" not in step
    assert fixed_point_step({}, twin) == {}  # no engine counters in the measurement: nothing to say


def test_a_pe_stall_adds_its_time_to_each_forward_whatever_its_size() -> None:
    cal = load_calibration(CALIBRATION)
    spec = RuntimeClusterSpec(snic_bytes_per_s=6e6, cnic_bytes_per_s=48e9)
    for trace in ([[(150, 1)]], [[(600, 1)]]):  # one forward on an idle host, no decode run
        plain = predict(spec, cal, "oracle", trace, cpu_factors={"decode_restart_s": 0.0})[0]
        stalled = predict(
            spec, cal, "oracle", trace, cpu_factors={"decode_restart_s": 0.0, "pe_stall_s": 0.05}
        )[0]
        pe_plain, pe_stalled = plain["engine_work"]["pe_engine"], stalled["engine_work"]["pe_engine"]
        assert pe_plain[0] == pe_stalled[0] == 1  # one piece each, the same CPU
        assert pe_stalled[2] == pytest.approx(pe_plain[2])
        assert pe_plain[1] == pytest.approx(pe_plain[2])  # alone on the host: wall = CPU
        assert pe_stalled[1] == pytest.approx(pe_plain[2] + 0.05)  # plus the stall, not times a factor
        assert stalled["ttft_mean_s"] - plain["ttft_mean_s"] == pytest.approx(0.05, rel=1e-6)
    # At half the cores' speed (the speed probe took twice the calibration's) the forward's CPU and its
    # stall, a wait for the cores, both take twice as long.
    slow_factors = {"decode_restart_s": 0.0, "pe_stall_s": 0.05, "probe_cpu_s": 0.001}
    slow = predict(spec, cal, "oracle", trace, cpu_factors=slow_factors, probe_cpu_s=0.002)[0]
    assert slow["engine_work"]["pe_engine"][1] == pytest.approx(2 * (pe_plain[2] + 0.05))


def test_the_twin_charges_the_in_situ_factors_and_background() -> None:
    cal = load_calibration(CALIBRATION)
    spec = RuntimeClusterSpec(snic_bytes_per_s=6e6, cnic_bytes_per_s=48e9)
    cal = dataclasses.replace(cal, overheads=dataclasses.replace(cal.overheads, store_write_op_s=0.0))

    def run(**f: float) -> tuple[float, dict[str, float]]:
        metrics, _ = predict(spec, cal, "oracle", TRACE, cpu_factors=f)
        return metrics["jct_s"], metrics["cpu_s_by_thread"]

    def ttft(**f: float) -> float:
        return float(predict(spec, cal, "oracle", TRACE, cpu_factors=f)[0]["ttft_mean_s"])

    base_jct, base_cpu = run()
    slow_jct, slow_cpu = run(pe_engine=3.0, de_engine=3.0)
    assert slow_cpu["pe0"] > 2.5 * base_cpu["pe0"] and slow_jct > 1.5 * base_jct
    # 1.5 of 2 cores kept busy by our background: one engine alone gets 2 / 2.5 of a core, two 2 / 3.5.
    busy_jct, _ = run(background_cores=1.5)
    assert busy_jct > 1.3 * base_jct
    late_jct, _ = run(decode_restart_s=0.05)  # a wait between every two decode runs
    assert late_jct > base_jct
    assert ttft(decode_restart_s=0.05) > ttft() + 0.03  # and before each forward's compute


def test_first_token_and_done_reach_the_client_one_busy_trip_later() -> None:
    """Oracle, one-token rounds (no decode runs): each round pays the trip to its forward, and its first
    token and its done each pay the node -> scheduler -> client trip (`decode_restart_s`)."""
    spec = RuntimeClusterSpec(snic_bytes_per_s=6e6, cnic_bytes_per_s=48e6)
    trace = [[(150, 1), (20, 1)]]
    cal = load_calibration(CALIBRATION)
    idle = predict(spec, cal, "oracle", trace, cpu_factors={"decode_restart_s": 0.0})[0]
    busy = predict(spec, cal, "oracle", trace, cpu_factors={"decode_restart_s": 0.05})[0]
    assert busy["ttft_mean_s"] - idle["ttft_mean_s"] == pytest.approx(2 * 0.05)
    assert busy["jct_s"] - idle["jct_s"] == pytest.approx(2 * 2 * 0.05)  # per round: forward trip + done
