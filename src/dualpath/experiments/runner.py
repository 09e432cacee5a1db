"""Run the simulator runs of a sweep in parallel worker processes, caching each result on disk.

Each run is a separate `dualpath simulate --json` process: runs are independent (DESIGN §4 "sim"), a crash or
a memory blow-up of one run cannot take the sweep down, and a finished run's JSON is written atomically to
`<out>/runs/<key>.json` so an interrupted `reproduce` resumes where it stopped instead of starting over.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from dualpath.experiments.runspec import RunSpec


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    spec: RunSpec
    result: dict | None  # the `--json` object of `dualpath simulate`; None when the run failed
    error: str | None = None


def default_workers() -> int:
    # One simulation per core; the simulator is single-threaded.
    return max(1, os.cpu_count() or 1)


def run_all(
    specs: Sequence[RunSpec], cache_dir: Path, *, workers: int | None = None, progress: bool = True
) -> dict[str, RunOutcome]:
    """Run every spec not already cached; return outcomes keyed by `spec.key()`."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    unique = {spec.key(): spec for spec in specs}
    outcomes = {key: _cached(spec, cache_dir) for key, spec in unique.items()}
    todo = [spec for key, spec in unique.items() if outcomes[key] is None]
    bar = tqdm(
        total=len(unique),
        initial=len(unique) - len(todo),
        desc="simulations",
        unit="run",
        disable=not progress,
        file=sys.stderr,
    )
    # Threads only wait on child processes here; the simulation work happens in the children.
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        futures = {pool.submit(_run_one, spec, cache_dir): spec for spec in todo}
        for future in as_completed(futures):
            outcome = future.result()
            outcomes[outcome.spec.key()] = outcome
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
    command = [sys.executable, "-m", "dualpath.cli.main", *spec.argv()]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return RunOutcome(spec=spec, result=None, error=" | ".join(tail) or f"exit {done.returncode}")
    try:
        result = json.loads(done.stdout[done.stdout.index("{") :])
    except ValueError:
        return RunOutcome(spec=spec, result=None, error="simulate printed no JSON object")
    path = cache_dir / f"{spec.key()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, sort_keys=True))
    os.replace(tmp, path)  # atomic: a crash never leaves a torn result that a resume would trust
    return RunOutcome(spec=spec, result=result)


def failed(outcomes: Iterable[RunOutcome]) -> list[RunOutcome]:
    return [outcome for outcome in outcomes if outcome.result is None]
