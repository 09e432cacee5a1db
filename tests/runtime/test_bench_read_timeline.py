"""The SNICs' read rates over a replay: `bench.SnicSampler`, `bench.read_timeline` and the plot of
`benchmarks/runtime_paths.py` that draws them."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import httpx
import pytest

from dualpath.runtime.bench import SnicSampler, read_timeline


def test_each_interval_gets_each_nodes_read_rate():
    timeline = read_timeline(
        [
            (0.0, {"p0": {"rx": 0.0}}),  # d0 not reported yet: nothing read there
            (0.5, {"p0": {"rx": 5e6}, "d0": {"rx": 0.0, "tx": 7e6}}),
            (0.5, {"p0": {"rx": 6e6}, "d0": {"rx": 0.0}}),  # no time passed: no interval
            (1.5, {"p0": {"rx": 6e6}, "d0": {"rx": 20e6}}),
        ]
    )
    assert timeline["t_s"] == [0.5, 1.5]
    assert timeline["read_mb_per_s"] == {"p0": pytest.approx([10.0, 0.0]), "d0": pytest.approx([0.0, 20.0])}


def test_no_samples_no_timeline():
    assert read_timeline([]) == {"t_s": [], "read_mb_per_s": {}}
    assert read_timeline([(0.0, {"p0": {"rx": 1.0}})]) == {"t_s": [], "read_mb_per_s": {"p0": []}}


def test_the_sampler_reads_until_stopped_then_once_more():
    count = itertools.count()
    sampler = SnicSampler(lambda: {"p0": {"rx": float(next(count))}}, every_s=0.01)
    sampler.start()
    time.sleep(0.1)
    sampler.stop()
    taken = len(sampler.samples)
    times = [t for t, _ in sampler.samples]
    assert taken >= 3 and times == sorted(times) and times[0] < 0.05
    assert [c["p0"]["rx"] for _, c in sampler.samples] == [float(i) for i in range(taken)]
    time.sleep(0.03)
    assert len(sampler.samples) == taken  # stopped: no more


@pytest.mark.parametrize("error", [httpx.ConnectError("refused"), ValueError("a page cut short")])
def test_a_server_that_stops_answering_ends_the_timeline_without_an_error(error: Exception):
    def gone() -> dict[str, dict[str, float]]:
        raise error

    sampler = SnicSampler(gone, every_s=0.01)
    sampler.start()
    time.sleep(0.03)
    sampler.stop()
    assert sampler.samples == []


def test_the_plot_is_a_png(runtime_paths, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def mode(jct_s: float, rates: dict[str, list[float]]) -> dict:
        t_s = [0.25 * (i + 1) for i in range(len(next(iter(rates.values()))))]
        return {
            "jct_s": jct_s,
            "runs_jct_s": [jct_s],
            "read_timelines": [{"t_s": t_s, "read_mb_per_s": rates}],
        }

    out = {
        "snic_bytes_per_s": 15e6,
        "basic_over_dualpath": 2.1,
        "dualpath_over_oracle": 1.3,
        "modes": {
            "basic": mode(8.0, {"p0": [0, 15, 15, 15], "d0": [0, 0, 0, 0], "d1": [0, 0, 0, 0]}),
            "dualpath": mode(4.0, {"p0": [0, 15, 15, 9], "d0": [0, 14, 15, 8], "d1": [0, 15, 15, 7]}),
            "oracle": {"jct_s": 3.0},
        },
    }
    path = tmp_path / "reads.png"
    runtime_paths.plot(out, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
