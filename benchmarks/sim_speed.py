"""End-to-end speed of `dualpath simulate`: wall time, events/s, CPU time and peak memory.

(a) DS-V3.2 2P4D, 64K, 2,048 agents offline, dualpath (the headline case);
(b) with `--large`: the paper's 48P96D, 48K-agent offline run (Table 3); `--scale F` runs a fraction
    of it: round(48·F) PE nodes (at least 2: DS-V3.2 needs EP >= 16), twice as many DE nodes and
    1,024 agents per PE node (the load per node of both runs), so a small machine can measure it and
    extrapolate (the work grows ~linearly with the node count at a fixed load per node).

Peak memory is the process's max resident set (resource.getrusage), which includes Python itself.
Prints a table and writes JSON (default `benchmarks/results/sim_speed.json`).
Usage: python benchmarks/sim_speed.py [--large] [--scale 1.0] [--mode dualpath] [--out PATH]
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


def _progress_line(sim: Simulation, wall0: float, every_s: float) -> Any:
    """A progress callback: one stderr line per `every_s` of wall time (simulated time, events, agents done),
    so that a long run that is stopped still says how far it got."""
    last = [wall0]

    def tick(kernel: Any) -> None:
        now = time.perf_counter()
        if now - last[0] >= every_s:
            last[0] = now
            done = sum(1 for a in sim.agents if a.end_s == a.end_s)
            print(f"[sim_speed] wall {now - wall0:7.0f} s  simulated {kernel.now_s:7.0f} s  "
                  f"events {kernel.events_processed:11d}  requests {len(sim.times):8d}  "
                  f"agents done {done}/{len(sim.agents)}", file=sys.stderr, flush=True)  # fmt: skip

    return tick


def case(p: int, d: int, agents: int, mode: str, progress_every_s: float = 0.0) -> dict[str, Any]:
    cluster = load_cluster(hardware="hopper-8x400g", model="deepseek-v3.2", num_prefill_nodes=p,
                           num_decode_nodes=d, overrides=[])  # fmt: skip
    trajectories = load_trajectories("64k", agents, 1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sim = Simulation(SimConfig(cluster=cluster, mode=mode), trajectories, seed=1)
    out = sim.run(_progress_line(sim, wall0, progress_every_s) if progress_every_s > 0 else None)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finished = [a.end_s for a in out.agents if a.end_s == a.end_s]
    return {
        "case": f"DS-V3.2 {p}P{d}D 64K {agents} agents offline {mode}",
        "p": p,
        "d": d,
        "agents": agents,
        "mode": mode,
        "compiled": bool(compiled_modules()),  # native build or pure Python (native.py)
        "requests": len(out.requests),
        "jct_s": max(finished) if len(finished) == len(out.agents) else None,
        "events": out.events,
        "wall_s": wall,
        "cpu_s": cpu,
        "events_per_s": out.events / wall,
        "events_per_request": out.events / max(1, len(out.requests)),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="the 48P96D 48K-agent run instead of 2P4D 2K")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of agents (and nodes) to run")
    ap.add_argument("--mode", default="dualpath")
    ap.add_argument("--progress-every", type=float, default=0.0, metavar="S",
                    help="a progress line on stderr every S seconds of wall time (0: none)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim_speed.json")
    a = ap.parse_args()
    p, d, agents = (48, 96, 49_152) if a.large else (2, 4, 2048)
    if a.large and a.scale != 1.0:
        p = max(2, round(p * a.scale))
        d, agents = 2 * p, 1024 * p
    row = case(p, d, agents, a.mode, a.progress_every)
    row["scale"] = a.scale
    row["machine"] = (
        f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}"
    )
    print(
        f"{'case':<52} {'wall s':>8} {'cpu s':>8} {'events':>10} {'ev/s':>8} {'ev/req':>7} {'peak MB':>8} {'JCT s':>8}"
    )
    print(f"{row['case']:<52} {row['wall_s']:8.1f} {row['cpu_s']:8.1f} {row['events']:10d} "
          f"{row['events_per_s']:8.0f} {row['events_per_request']:7.1f} {row['peak_rss_bytes'] / 1e6:8.0f} "
          f"{row['jct_s'] or float('nan'):8.0f}")  # fmt: skip
    print(row["machine"])
    results = json.loads(a.out.read_text()) if a.out.exists() else {}
    results[row["case"]] = row
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
