"""`dualpath validate`: the same trace through the runtime (measured) and the simulator (predicted).

Per mode: a fresh local cluster replays the bench trace (as `runtime.experiment.run_mode`), and the
simulator, set up from the cluster file and a calibration (`twin.predict`), replays the same scaled
rounds. The comparison is per metric: measured, predicted, error % = (predicted - measured) / measured.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualpath.runtime.bench import BenchOptions, make_plans
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.twin.calibration import Calibration, Tick
from dualpath.twin.host_load import HostLoadSampler
from dualpath.twin.predict import predict, read_path_bytes

COMPARED = ("jct_s", "ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "throughput_tok_s")
CONDITIONS = ("external_cores", "probe_cpu_s")  # the host's, sampled during a run (`host_load`)


@dataclass(frozen=True, kw_only=True)
class ModeResult:
    """One mode: the mean over its runs of what was measured and of what the twin predicted for each."""

    mode: str
    measured: dict[str, Any]
    predicted: dict[str, Any]
    runs: tuple[dict[str, dict[str, float | None]], ...] = ()  # per run: metrics, conditions

    def error_pct(self) -> dict[str, float | None]:
        return {k: error_pct(self.measured.get(k), self.predicted.get(k)) for k in COMPARED}

    def to_dict(self) -> dict[str, Any]:
        out = {side: {k: v for k, v in getattr(self, side).items() if k != "ttft_series"}
               for side in ("measured", "predicted")}  # fmt: skip
        return {**out, "error_pct": self.error_pct(), "runs": list(self.runs)}


def mean_of(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The runs' mean, key by key: numbers averaged, nested tables by leaf, lists of numbers element by
    element; other lists (a TTFT series) put together."""
    out: dict[str, Any] = {}
    for key, first in results[0].items():
        values = [r[key] for r in results if key in r]
        if isinstance(first, bool) or first is None:
            out[key] = first
        elif isinstance(first, (int, float)):
            out[key] = sum(float(v) for v in values) / len(values)
        elif isinstance(first, dict):
            out[key] = mean_of(values)
        elif isinstance(first, (list, tuple)) and all(isinstance(x, (int, float)) for x in first):
            out[key] = [sum(float(v[i]) for v in values) / len(values) for i in range(len(first))]
        elif isinstance(first, (list, tuple)):
            out[key] = sorted(x for v in values for x in v)
        else:
            out[key] = first
    return out


def error_pct(measured: Any, predicted: Any) -> float | None:
    if not isinstance(measured, (int, float)) or not isinstance(predicted, (int, float)) or measured == 0:
        return None
    if math.isnan(measured) or math.isnan(predicted):
        return None
    return 100.0 * (predicted - measured) / measured


def trace_rounds(options: BenchOptions) -> list[list[tuple[int, int]]]:
    """The bench's agents' scaled (append, generated) rounds: the exact trace the runtime replays."""
    return [list(plan.rounds) for plan in make_plans(options)]


def measure_mode(mode: str, options: BenchOptions, *, config: str, settings: Sequence[str] = (),
                 progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """One fresh cluster with an empty store (as `runtime.experiment.run_mode`), keeping per-round times."""
    from dualpath.runtime.bench import run as run_bench
    from dualpath.runtime.launcher import ServeProcess

    extra = tuple(arg for item in settings for arg in ("--set", item))
    with (
        tempfile.TemporaryDirectory(prefix="dualpath-store-") as store,
        ServeProcess(config, mode=mode, store_dir=Path(store), extra_args=extra) as server,
    ):
        assert server.process is not None
        # Other jobs' CPU: everything outside this process and its descendants (the serve child, its
        # nodes); our own processes are the system the twin predicts.
        with HostLoadSampler(os.getpid()) as host:
            summary, result = run_bench(server.url, options, progress=progress)
    measured = measured_metrics(summary, result.rounds)
    measured["external_cores"] = host.cores()
    measured["probe_cpu_s"] = host.probe_cpu_s()
    return measured


def measured_metrics(summary: dict[str, Any], rounds: Sequence[Any]) -> dict[str, Any]:
    snic = {node: {"rx": float(d["rx"]), "tx": float(d["tx"])} for node, d in summary["snic"].items()}
    return {
        "jct_s": float(summary["jct_s"]),
        "ttft_mean_s": float(summary["ttft_s"]["mean"]),
        "ttft_p90_s": float(summary["ttft_s"]["p90"]),
        "tpot_mean_s": float(summary["tpot_s"]["mean"]),
        # Generated tokens over the makespan (the runtime's wall also covers the client's start-up).
        "throughput_tok_s": float(summary["generated_tokens"]) / float(summary["jct_s"]),
        "snic_bytes": snic,
        "ttft_series": sorted((r.first_token_s, r.ttft_s) for r in rounds),
        "milestones_mean_s": dict(summary.get("milestones_mean_s", {})),
        "scheduler_rates": dict(summary.get("scheduler_rates", {})),
    }


def validate(spec: RuntimeClusterSpec, cal: Calibration, options: BenchOptions, modes: Sequence[str], *,
             config: str, settings: Sequence[str] = (), progress: Tick = lambda _: None, bars: bool = False,
             repeats: int = 1) -> dict[str, ModeResult]:  # fmt: skip
    """Each mode `repeats` times, on a fresh cluster each time, modes interleaved (a drift of the host
    over minutes then touches every mode alike); each run predicted with its own conditions, and the
    means compared: one run of the same trace moves by up to ±25 % (oracle, docs/twin.md)."""
    trajectories = trace_rounds(options)
    runs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {mode: [] for mode in modes}
    for k in range(repeats):
        for mode in modes:
            label = f"[{mode}{f' {k + 1}/{repeats}' if repeats > 1 else ''}]"
            progress(f"{label} replaying {options.agents} agents on a fresh {spec.name} cluster ...")
            measured = measure_mode(mode, options, config=config, settings=settings, progress=bars)
            measured["read_path_bytes"] = read_path_bytes(measured["snic_bytes"], spec)
            # Other jobs' CPU and the cores' speed while the runtime ran: the machine's conditions, which
            # the twin takes from the run (not metrics; docs/twin.md "Other jobs", "The host's speed").
            external, probe = measured.get("external_cores") or 0.0, measured.get("probe_cpu_s") or 0.0
            progress(f"{label} simulating the trace on the calibrated twin (other jobs used "
                     f"{external:.2f} cores; speed probe {1e3 * probe:.2f} ms) ...")  # fmt: skip
            # And the run's scheduler constants (β, the §6.4 quota: the PE measured them at start-up),
            # so that the twin's core batches as the runtime's did: inputs of the run, like its config.
            predicted, _ = predict(spec, cal, mode, trajectories, aps=options.aps, seed=options.seed,
                                   external_cores=external, probe_cpu_s=probe,
                                   scheduler_rates=measured.get("scheduler_rates"))  # fmt: skip
            runs[mode].append((measured, predicted))
    return {
        mode: ModeResult(
            mode=mode,
            measured=mean_of([m for m, _ in pairs]),
            predicted=mean_of([p for _, p in pairs]),
            runs=tuple(
                {
                    "measured": {k: m[k] for k in COMPARED},
                    "predicted": {k: p[k] for k in COMPARED},
                    "conditions": {k: m.get(k) for k in CONDITIONS},
                }
                for m, p in pairs
            ),
        )
        for mode, pairs in runs.items()
    }


_LAYOUT = ("name", "num_prefill_nodes", "num_decode_nodes", "engines_per_node", "block_tokens", "hbm_tokens",
           "dram_buffer_bytes", "snic_bytes_per_s", "cnic_bytes_per_s", "read_path")  # fmt: skip


def layout(spec: RuntimeClusterSpec) -> dict[str, Any]:
    return {key: getattr(spec, key) for key in _LAYOUT}
