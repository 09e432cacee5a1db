"""Executors: a sweep through Ray tasks gives the same results JSON as the local process pool, and a
failed Ray task is retried once, then reported."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath.experiments.runner import failed, run_all
from dualpath.experiments.runspec import RunSpec
from dualpath.experiments.sweep import Sweep, parse_sweep
from dualpath.experiments.sweep_report import write_sweep

try:
    import ray
except ImportError:  # the optional extra: pip install 'dualpath[ray]' (make test installs it)
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="ray is not importable (install the 'ray' extra)")


def small_sweep(agents: list[int]) -> Sweep:
    raw = {
        "name": "executors",
        "base": {"model": "ds-27b", "layout": "1P1D", "dataset": "32k"},
        "grid": {"mode": ["basic", "dualpath"], "agents": agents},
    }
    return parse_sweep(raw, where="test", folder=Path("."))


def results_json(sweep: Sweep, out: Path, **executor: object) -> dict:
    outcomes = run_all(sweep.specs(), out / "runs", progress=False, **executor)  # type: ignore[arg-type]
    assert not failed(outcomes.values())
    return json.loads(write_sweep(sweep, outcomes, out, header="")["json"].read_text())


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    assert ray is not None
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@needs_ray
def test_ray_and_the_process_pool_give_the_same_results(tmp_path: Path, local_ray: None) -> None:
    sweep = small_sweep([1, 2, 3])
    pool = results_json(sweep, tmp_path / "pool", workers=2)
    through_ray = results_json(sweep, tmp_path / "ray", ray_address="auto")
    assert len(pool["runs"]) == 6 and all(r["ok"] for r in pool["runs"])
    assert through_ray == pool
    assert len(list((tmp_path / "ray" / "runs").glob("*.json"))) == 6  # streamed into the driver's cache


@needs_ray
def test_a_failed_ray_task_is_retried_once_then_reported(tmp_path: Path, local_ray: None) -> None:
    bad = RunSpec(model="no-such-model", p=1, d=1, mode="basic", agents=1)
    good = RunSpec(model="ds-27b", p=1, d=1, mode="basic", agents=1, dataset="32k")
    outcomes = run_all([bad, good], tmp_path, progress=False, ray_address="auto")
    assert set(outcomes) == {bad.key(), good.key()}  # nothing dropped
    (lost,) = failed(outcomes.values())
    assert lost.spec == bad and lost.attempts == 2 and "no-such-model" in (lost.error or "")
    assert outcomes[good.key()].result is not None and outcomes[good.key()].attempts == 1
    assert not (tmp_path / f"{bad.key()}.json").exists()


@needs_ray
@pytest.mark.slow
def test_a_24_run_sweep_is_identical_through_ray(tmp_path: Path, local_ray: None) -> None:
    sweep = small_sweep(list(range(1, 13)))
    assert len(sweep.runs) == 24
    assert results_json(sweep, tmp_path / "ray", ray_address="auto") == results_json(
        sweep, tmp_path / "pool", workers=2
    )


@needs_ray
def test_reproduce_runs_through_ray(tmp_path: Path, local_ray: None, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from dualpath.cli.main import main
    from dualpath.experiments import scenarios

    tiny = [RunSpec(model="ds-27b", p=1, d=1, mode=m, agents=1, dataset="32k") for m in ("basic", "dualpath")]
    fig8 = replace(scenarios.EXPERIMENTS["fig8"], specs=lambda quick: tiny)
    monkeypatch.setitem(scenarios.EXPERIMENTS, "fig8", fig8)
    assert main(["reproduce", "fig8", "--quick", "--ray", "auto", "-o", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "runs").glob("*.json")) == sorted(
        f"{s.key()}.json" for s in tiny
    )
    assert "Ray auto" in (tmp_path / "report.md").read_text()
