"""Fig. 13 windowed SNIC read balance and Fig. 14 attention balance by the run's progress."""

from __future__ import annotations

import pytest

from dualpath.config.loader import load_cluster
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SNIC_WINDOW_S, SimConfig, SimOutcome, Simulation, run_end_s
from dualpath.sim.summary import PROGRESS_EDGES, by_progress, snic_read_windows, summarise


def simulate(mode: str, agents: int = 24, rounds: int = 12) -> SimOutcome:
    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=[])  # fmt: skip
    trajectories = [t[:rounds] for t in load_trajectories("64k", agents, 1)]
    return Simulation(SimConfig(cluster=cluster, mode=mode), trajectories, seed=1).run()


def test_snic_windows_add_up_to_the_whole_run_and_are_about_a_window_long() -> None:
    out = simulate("dualpath", agents=16, rounds=80)  # ≈ 31 s of simulated time: three windows
    samples = out.snic_read_samples
    times = [t for t, _ in samples]
    assert times == sorted(times) and times[-1] == run_end_s(out.agents, out.end_s)
    assert samples[0][1] == (0.0, 0.0)  # sampled before the first read started
    whole = summarise(out, offline=True, wall_s=0.0)["snic_read_bytes"]
    assert samples[-1][1] == pytest.approx((whole["0"], whole["1"]), rel=1e-12)
    lengths = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(length >= SNIC_WINDOW_S / 2 for length in lengths)
    assert sorted(lengths)[len(lengths) // 2] == pytest.approx(SNIC_WINDOW_S, rel=0.05)


def test_snic_window_ratio_is_max_over_mean_per_window() -> None:
    samples = [(0.0, (0.0, 0.0)), (10.0, (30.0, 10.0)), (20.0, (30.0, 10.0)), (30.0, (40.0, 20.0))]
    w = snic_read_windows(samples)
    assert w is not None
    # Window 1: 30 vs 10 -> 30 / 20; window 2 read nothing (left out); window 3: 10 vs 10 -> 1.
    assert w["all"]["windows"] == 2 and w["all"]["max"] == pytest.approx(1.5)
    assert w["all"]["mean"] == pytest.approx(1.25)
    # Mean window total 30: window 3 (20) is loaded, 15 would not be.
    assert w["loaded"]["windows"] == 2
    assert snic_read_windows([(0.0, (0.0, 0.0)), (10.0, (0.0, 0.0))]) is None


def test_by_progress_bins_steps_by_their_start_time() -> None:
    end = 100.0
    got = by_progress([1.0, 3.0, 2.0, 5.0], [0.0, 4.9, 5.0, 99.0], end)
    labels = [f"{100 * a:g}-{100 * b:g}%" for a, b in zip(PROGRESS_EDGES, PROGRESS_EDGES[1:], strict=False)]
    assert list(got) == labels
    assert got["0-5%"] == pytest.approx(2.0) and got["5-20%"] == pytest.approx(2.0)
    assert got["20-50%"] is None and got["80-100%"] == pytest.approx(5.0)


def test_attention_by_progress_covers_every_step() -> None:
    out = simulate("dualpath")
    assert len(out.attention_times_s) == len(out.attention_ratios)
    assert len(out.attention_busy_times_s) == len(out.attention_ratios_busy)
    s = summarise(out, offline=True, wall_s=0.0)
    parts = s["attention_max_over_avg_by_progress"]
    assert all(v is None or v >= 1.0 for v in parts.values())
    # The per-stretch means, weighed by their steps, give back the whole run's mean.
    total = 0.0
    for label, mean in parts.items():
        k = sum(1 for t in out.attention_times_s if _label_of(t, run_end_s(out.agents, out.end_s)) == label)
        total += (mean or 0.0) * k
    assert total / len(out.attention_ratios) == pytest.approx(s["attention_max_over_avg"], rel=1e-9)


def _label_of(t: float, end_s: float) -> str:
    for a, b in zip(PROGRESS_EDGES, PROGRESS_EDGES[1:], strict=False):
        if t < b * end_s or b == PROGRESS_EDGES[-1]:
            return f"{100 * a:g}-{100 * b:g}%"
    raise AssertionError


def test_read_waits_say_when_a_snic_idles_with_reads_queued() -> None:
    """A DRAM buffer too small for two requests' hit KV leaves the PE SNIC idle while reads wait; the
    80 GB buffer never does. Only runs that record links (`-o`) sample the readers."""
    trajectories = [t[:30] for t in load_trajectories("64k", 48, 1)]
    waits = {}
    for buffer in ("80GB", "0.3GB"):
        cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                               overrides=[f"hardware.dram_buffer_bytes={buffer}"])  # fmt: skip
        config = SimConfig(cluster=cluster, mode="basic", record_links=True)
        out = Simulation(config, trajectories, seed=1).run()
        assert len(out.reader_samples) == len(out.queue_samples) > 0
        waits[buffer] = summarise(out, offline=True, wall_s=0.0)["read_waits"]
        assert waits[buffer]["1"]["waiting_samples"] == 0  # basic reads on the PE side only
        queued = [s[0] for s in out.reader_samples if s[0][0] > 0]
        assert waits[buffer]["0"]["waiting_samples"] == len(queued) > 0
        idle = sum(1 for q in queued if q[1] == 0) / len(queued)
        assert waits[buffer]["0"]["idle"] == pytest.approx(idle)
    assert waits["80GB"]["0"]["idle"] == 0.0
    assert waits["0.3GB"]["0"]["idle"] > 0.5
    assert waits["0.3GB"]["0"]["buffer_used"] > waits["80GB"]["0"]["buffer_used"]
    plain = summarise(simulate("basic"), offline=True, wall_s=0.0)
    assert plain["read_waits"] is None  # no samples without `record_links`
