"""Run the simulator runs of a sweep in parallel (worker processes or Ray tasks), caching each result.

Each run is a separate `dualpath simulate --json` process: runs are independent (DESIGN §4 "sim"), a crash or
a memory blow-up of one run cannot take the sweep down, and a finished run's JSON is written atomically to
`<out>/runs/<key>.json` so an interrupted `reproduce` resumes where it stopped instead of starting over.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm import tqdm

from dualpath.experiments.executors import (
    RunOutcome,
    cluster_cpus,
    connect_ray,
    import_ray,
    local_runs,
    ray_runs,
    simulate,
)
from dualpath.experiments.runspec import RunSpec

__all__ = ["RunOutcome", "default_workers", "failed", "load_cached", "run_all"]


def default_workers() -> int:
    # One simulation per core; the simulator is single-threaded.
    return max(1, os.cpu_count() or 1)


def run_all(
    specs: Sequence[RunSpec],
    cache_dir: Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    ray_address: str | None = None,
    on_outcome: Callable[[RunOutcome], None] | None = None,
) -> dict[str, RunOutcome]:
    """Run every spec not already cached; return outcomes keyed by `spec.key()`.

    Local worker processes by default; with `ray_address` ("auto" or a cluster address) one Ray task per
    run (executors.py). Each result is written to the cache as it arrives, whichever executor ran it.
    `on_outcome` is called with each outcome as it comes (cached ones first).
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    unique = {spec.key(): spec for spec in specs}
    outcomes = {key: _cached(spec, cache_dir) for key, spec in unique.items()}
    todo = [spec for key, spec in unique.items() if outcomes[key] is None]
    if on_outcome is not None:
        for cached in outcomes.values():
            if cached is not None:
                on_outcome(cached)
    if ray_address is not None and todo:
        connect_ray(import_ray(), ray_address)  # before the bar: it names the cluster's CPUs
        finished = ray_runs(todo, address=ray_address)
        where = f"ray, {cluster_cpus()} CPUs"
    else:
        finished = local_runs(todo, workers=workers or default_workers())
        where = f"{workers or default_workers()} workers"
    bar = tqdm(
        total=len(unique),
        initial=len(unique) - len(todo),
        desc=f"simulations ({where})",
        unit="run",
        disable=not progress,
        file=sys.stderr,
    )
    for outcome in finished:
        if outcome.result is not None:
            _store(outcome, cache_dir)
        outcomes[outcome.spec.key()] = outcome
        if on_outcome is not None:
            on_outcome(outcome)
        bar.set_postfix_str(outcome.spec.label()[:60])
        bar.update()
    bar.close()
    return {key: outcome for key, outcome in outcomes.items() if outcome is not None}


def load_cached(specs: Sequence[RunSpec], cache_dir: Path) -> dict[str, RunOutcome]:
    """The outcomes already on disk, running nothing (`reproduce --report-only`)."""
    found = {spec.key(): _cached(spec, cache_dir) for spec in specs}
    return {key: outcome for key, outcome in found.items() if outcome is not None}


def _cached(spec: RunSpec, cache_dir: Path) -> RunOutcome | None:
    path = cache_dir / f"{spec.key()}.json"
    if not path.exists():
        return None
    return RunOutcome(spec=spec, result=json.loads(path.read_text()))


def _run_one(spec: RunSpec, cache_dir: Path) -> RunOutcome:
    outcome = simulate(spec)
    if outcome.result is not None:
        _store(outcome, cache_dir)
    return outcome


def _store(outcome: RunOutcome, cache_dir: Path) -> None:
    path = cache_dir / f"{outcome.spec.key()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(outcome.result, sort_keys=True))
    os.replace(tmp, path)  # atomic: a crash never leaves a torn result that a resume would trust


def failed(outcomes: Iterable[RunOutcome]) -> list[RunOutcome]:
    return [outcome for outcome in outcomes if outcome.result is None]
