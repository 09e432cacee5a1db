"""Where the runs of a sweep execute: local worker processes (default) or Ray tasks on a cluster.

Both executors yield one `RunOutcome` per spec as it finishes; `runner.run_all` stores each successful
result in the run cache the moment it arrives, so an interrupted sweep resumes either way. A run is one
`dualpath simulate --json` process in both: the Ray task starts that process on whichever node Ray picked
and returns its JSON, so results are byte-for-byte those of the local pool (the simulator is
deterministic for a seed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any

from dualpath.experiments.runspec import RunSpec

# A failed Ray task is submitted once more, then reported (issue 19: never silently dropped).
RAY_ATTEMPTS = 2


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    spec: RunSpec
    result: dict | None  # the `--json` object of `dualpath simulate`; None when the run failed
    error: str | None = None
    attempts: int = 1


def simulate(spec: RunSpec) -> RunOutcome:
    """One `dualpath simulate` process for `spec`; never raises for a failed run."""
    command = [sys.executable, "-m", "dualpath.cli.main", *spec.argv()]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return RunOutcome(spec=spec, result=None, error=" | ".join(tail) or f"exit {done.returncode}")
    try:
        result = json.loads(done.stdout[done.stdout.index("{") :])
    except ValueError:
        return RunOutcome(spec=spec, result=None, error="simulate printed no JSON object")
    return RunOutcome(spec=spec, result=result)


def local_runs(specs: Sequence[RunSpec], *, workers: int) -> Iterator[RunOutcome]:
    """Up to `workers` simulate processes at once on this machine, outcomes in completion order."""
    # Threads only wait on child processes here; the simulation work happens in the children.
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(simulate, spec) for spec in specs]
        for future in as_completed(futures):
            yield future.result()


def ray_runs(specs: Sequence[RunSpec], *, address: str) -> Iterator[RunOutcome]:
    """One Ray task per spec (1 CPU each), outcomes streamed back as tasks finish.

    `address`: "auto" joins the running cluster (`ray start`, RAY_ADDRESS) or, when there is none, starts
    a local instance; anything else is a cluster address (`ray://host:10001`, `host:6379`). A process that
    already called `ray.init` keeps its instance.
    """
    ray = import_ray()
    connect_ray(ray, address)
    # max_retries: Ray re-runs a task whose worker died (system failure); an application failure (the
    # simulate process exited non-zero) comes back as an outcome and is resubmitted below.
    task = ray.remote(num_cpus=1, max_retries=1)(_remote_simulate)
    pending: dict[Any, tuple[RunSpec, int]] = {task.remote(spec): (spec, 1) for spec in specs}
    while pending:
        [ref], _ = ray.wait(list(pending), num_returns=1)
        spec, attempt = pending.pop(ref)
        try:
            outcome: RunOutcome = ray.get(ref)
        except Exception as error:  # RayTaskError, WorkerCrashedError, ... after Ray's own retry
            outcome = RunOutcome(spec=spec, result=None, error=f"ray task failed: {error!s:.300}")
        outcome = replace(outcome, attempts=attempt)
        if outcome.result is None and attempt < RAY_ATTEMPTS:
            pending[task.remote(spec)] = (spec, attempt + 1)
            continue
        yield outcome


def _remote_simulate(spec: RunSpec) -> RunOutcome:
    return simulate(spec)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "--ray needs the optional Ray extra: pip install 'dualpath[ray]' (or pip install ray)"
        ) from None
    return ray


def connect_ray(ray: Any, address: str) -> None:
    if ray.is_initialized():
        return
    kwargs = {"log_to_driver": False, "configure_logging": False}
    if address != "auto":
        ray.init(address=address, **kwargs)
        return
    try:
        ray.init(address="auto", **kwargs)
    except ConnectionError:
        ray.init(**kwargs)  # no running cluster: a local instance with this machine's cores


def cluster_cpus() -> int | None:
    """CPUs of the Ray cluster this process is connected to (for the progress bar), None without one."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    return int(ray.cluster_resources().get("CPU", 0))
