"""`benchmarks/runtime_operating_point.py`: `runtime_paths.py`'s rate rule applied to the twin's Oracle."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from dualpath.twin import load_calibration

CALIBRATION = Path(__file__).parent / "data" / "cal-cpu.toml"
SCRIPT = Path(__file__).parents[2] / "benchmarks" / "runtime_operating_point.py"


@pytest.fixture(scope="module")
def script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("runtime_operating_point", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))  # as when run: it takes runtime_paths.py's rate rule
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


@pytest.fixture(scope="module")
def points(script) -> list[dict]:  # type: ignore[no-untyped-def]
    args = argparse.Namespace(rounds=[2, 4], rho=[0.5, 1.0], agents=4, context_scale=1 / 32)
    return script.sweep(load_calibration(CALIBRATION), args, lambda _: None)


def test_the_rate_is_runtime_paths_rule(points: list[dict]) -> None:
    for p in points:
        # hit bytes / (3 SNICs x rho x Oracle JCT): DualPath's SNICs rho-busy over an Oracle-long run
        assert p["snic_bytes_per_s"] * 3 * p["rho"] * p["oracle_jct_s"] == pytest.approx(p["hit_bytes"])
        assert p["basic_over_dualpath"] == pytest.approx(p["basic_jct_s"] / p["dualpath_jct_s"])
        assert p["dualpath_over_oracle"] == pytest.approx(p["dualpath_jct_s"] / p["oracle_jct_s"])
        assert p["meets_bars"] == (p["basic_over_dualpath"] >= 2.0 and p["dualpath_over_oracle"] <= 1.3)


def test_the_first_round_weighs_less_in_a_longer_trace(points: list[dict]) -> None:
    share = {p["rounds"]: p["first_round_share"] for p in points}
    assert 0 < share[4] < share[2] < 1
    for p in points:  # rho over the rounds that read
        assert p["hit_bytes"] > 0
        assert p["reading_rounds_snic_load"] == pytest.approx(p["rho"] / (1 - p["first_round_share"]))


def test_a_higher_design_load_slows_basic_more_than_dualpath(points: list[dict]) -> None:
    low, high = sorted((p for p in points if p["rounds"] == 4), key=lambda p: p["rho"])
    assert high["snic_bytes_per_s"] < low["snic_bytes_per_s"]
    assert high["basic_jct_s"] > low["basic_jct_s"]
    assert high["basic_jct_s"] - low["basic_jct_s"] > high["dualpath_jct_s"] - low["dualpath_jct_s"]


def test_the_plot_is_a_png(script, points: list[dict], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "operating_point.png"
    script.plot(points, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
