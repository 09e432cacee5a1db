"""Simulator cost under overload: wall and CPU time per event, flat across load.

Capacity planning runs a cluster past its knee, where queues grow with the load; a run must then cost
O(events · log), not O(events · queue length). This runs DS 27B on 1P1D, 64K, and reports per run the
events, wall and CPU seconds, µs per event (wall and CPU) and the longest queues seen (`waiting`: requests
submitted and not yet on a PE, in the scheduler's queues; `in system`: submitted and not yet done), and within each run the CPU µs per event of its first and last quarter
of events (the queue is longest at the end of an overloaded run, so a scan per event shows as a late
quarter slower than the early one):

(a) offline, `--agents` (default 128 → 4,096, doubling), mode `--mode` (default basic);
(b) online at `--online-factor` (default 2) × the saturating APS, for each `--online-duration` (default
    600, 1,200 and 2,400 s of simulated time: the queue grows with the duration). The saturating APS is
    the offline throughput of the largest offline run (agents ÷ JCT), what the cluster serves in steady
    state; without offline runs it is `--saturating-aps`.

µs per event is the figure that must stay flat; CPU time is printed beside wall time because a shared
machine's wall time moves with its other jobs (load averages at start and end are in the JSON).
Prints a table, or one JSON object with `--json`; `--out PATH` also writes the JSON there.
Usage: python benchmarks/sim_overload.py [--agents 128,256,...] [--mode basic] [--json] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

from dualpath.config.loader import load_cluster
from dualpath.native import compiled_modules
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation

MODEL, HARDWARE, P, D, DATASET = "ds-27b", "hopper-8x400g", 1, 1, "64k"
SAMPLE_EVERY_EVENTS = 10_000


def run_case(mode: str, agents: int, aps: float | None, duration_s: float | None) -> dict[str, Any]:
    """One simulation; samples (events, CPU s, waiting) every SAMPLE_EVERY_EVENTS events."""
    cluster = load_cluster(hardware=HARDWARE, model=MODEL, num_prefill_nodes=P, num_decode_nodes=D,
                           overrides=[])  # fmt: skip
    trajectories = load_trajectories(DATASET, agents, 1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sim = Simulation(
        SimConfig(cluster=cluster, mode=mode, aps=aps, duration_s=duration_s), trajectories, seed=1
    )
    samples: list[tuple[int, float, int, int]] = [(0, 0.0, 0, 0)]

    def sample(kernel: Any) -> None:
        samples.append((kernel.events_processed, time.process_time() - cpu0, sim.core.scheduler.waiting,
                        sim.core.active_requests))  # fmt: skip

    out = sim.run(sample)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    samples.append((out.events, cpu, sim.core.scheduler.waiting, sim.core.active_requests))
    finished = [a.end_s for a in out.agents if a.end_s == a.end_s]
    load = f"{aps:g} APS for {duration_s:g} s ({agents} agents)" if aps else f"{agents} agents offline"
    return {
        "case": f"DS 27B {P}P{D}D {DATASET} {load} {mode}",
        "mode": mode,
        "agents": agents,
        "aps": aps,
        "duration_s": duration_s,
        "events": out.events,
        "requests": len(out.requests),
        "agents_finished": len(finished),
        "jct_s": max(finished) if aps is None and len(finished) == agents else None,
        "sim_end_s": out.end_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "wall_us_per_event": 1e6 * wall / max(1, out.events),
        "cpu_us_per_event": 1e6 * cpu / max(1, out.events),
        "max_waiting": max(s[2] for s in samples),
        "max_in_system": max(s[3] for s in samples),
        "cpu_us_per_event_quarters": _quarters(samples),
    }


def _quarters(samples: list[tuple[int, float, int, int]]) -> list[float | None]:
    """CPU µs per event in each quarter of the run's events (from the nearest samples)."""
    total = samples[-1][0]
    out: list[float | None] = []
    for q in range(4):
        lo = [s for s in samples if s[0] <= total * q / 4][-1]
        hi = [s for s in samples if s[0] >= total * (q + 1) / 4][0]
        out.append(1e6 * (hi[1] - lo[1]) / (hi[0] - lo[0]) if hi[0] > lo[0] else None)
    return out


def machine() -> dict[str, Any]:
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.processor() or 'cpu'}, "
        f"{platform.python_implementation()} {platform.python_version()}",
        "compiled": bool(compiled_modules()),  # native build or pure Python (dualpath/native.py)
        "load_average": os.getloadavg(),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'case':<58} {'events':>9} {'wall s':>7} {'cpu s':>7} {'wall µs/ev':>10} {'cpu µs/ev':>9} "
            f"{'max waiting':>11} {'in system':>9}  cpu µs/ev by quarter")  # fmt: skip
    lines = [head]
    for r in rows:
        quarters = " ".join("-" if q is None else f"{q:.0f}" for q in r["cpu_us_per_event_quarters"])
        lines.append(f"{r['case']:<58} {r['events']:9d} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} "
                     f"{r['wall_us_per_event']:10.1f} {r['cpu_us_per_event']:9.1f} {r['max_waiting']:11d} {r['max_in_system']:9d}  "
                     f"{quarters}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--agents", default="128,256,512,1024,2048,4096", help="offline agent counts ('' for none)"
    )
    ap.add_argument("--mode", default="basic")
    ap.add_argument("--online-factor", type=float, default=2.0, help="online APS = this × saturating APS")
    ap.add_argument("--online-duration", default="600,1200,2400", help="seconds ('' for no online runs)")
    ap.add_argument("--saturating-aps", type=float, default=None, help="when no offline run measures it")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    a = ap.parse_args()
    started = machine()
    rows = []
    for n in [int(x) for x in a.agents.split(",") if x]:
        rows.append(run_case(a.mode, n, None, None))
        print(f"[sim_overload] {rows[-1]['case']}: {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    saturating = a.saturating_aps
    if rows and rows[-1]["jct_s"]:
        saturating = rows[-1]["agents"] / rows[-1]["jct_s"]
    durations = [float(x) for x in a.online_duration.split(",") if x]
    if durations and saturating is None:
        ap.error("online runs need a saturating APS: an offline run or --saturating-aps")
    for duration_s in durations:
        aps = round(a.online_factor * saturating, 3)
        rows.append(run_case(a.mode, max(1, round(aps * duration_s)), aps, duration_s))
        print(f"[sim_overload] {rows[-1]['case']}: {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    result = {
        **started,
        "load_average_end": os.getloadavg(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "saturating_aps": saturating,
        "online_factor": a.online_factor,
        "runs": rows,
    }
    text = json.dumps(result, indent=2, sort_keys=True)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    if a.json:
        print(text)
    else:
        print(table(rows))
        print(f"{started['machine']}; compiled {started['compiled']}; saturating APS {saturating}; "
              f"load average {started['load_average'][0]:.1f} -> {result['load_average_end'][0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
