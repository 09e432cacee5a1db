"""End-to-end speed of `dualpath simulate`: wall and CPU time, events/s, µs per event, peak memory, phases.

(a) DS-V3.2 2P4D, 64K, 2,048 agents offline, dualpath (the headline case; `--mode` for the others);
(b) with `--large`: the paper's 48P96D, 48K-agent offline run (Table 3); `--scale F` runs a fraction
    of it: round(48·F) PE nodes (at least 2: DS-V3.2 needs EP >= 16), twice as many DE nodes and
    1,024 agents per PE node (the load per node of both runs), so a small machine can measure it and
    extrapolate (the work grows ~linearly with the node count at a fixed load per node).

`--phases` runs the kernel's loop here instead (the same events in the same order: `timed_run`) and
charges each callback's CPU time (`time.thread_time_ns`) to a phase: the kernel callback, and for a
flow's completion the callback the flow was started with. It prints a table of calls, CPU seconds,
share and µs per call. The timing itself costs ≈ 1 µs per event, so the run's total is higher than
without `--phases`; the shares are what the table is for.

Peak memory is the process's max resident set (resource.getrusage), which includes Python itself.
Prints a table, or one JSON object with `--json`; appends the row to `--out` (default
`benchmarks/results/sim_speed.json`) unless `--out ''`.
Usage: python benchmarks/sim_speed.py [--large] [--scale 1.0] [--mode dualpath] [--phases] [--json] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from dualpath.config.loader import load_cluster
from dualpath.native import compiled_modules
from dualpath.sim.agents import load_trajectories
from dualpath.sim.driver import SimConfig, Simulation
from dualpath.sim.gc_tuning import held_back_gc
from dualpath.sim.huge_pages import anon_huge_page_bytes, arena_stats, use_huge_page_arenas
from dualpath.sim.kernel import _heap_pop as heap_pop

# Kernel and flow callbacks by name -> the phase of a request's life they stand for (docs/simulator.md).
PHASES = {
    "_next_round": "arrival (agent's next round)",
    "_fetch": "fetch (scheduler placement, reads start)",
    "_activate": "flow start after its latency",
    "_compute_done": "prefill step end (batch, next step)",
    "_decode_event": "decode run end (tokens, next run)",
    "_update_rates": "link rate update (max-min)",
    "_read_done": "flow done: storage read",
    "_load_done": "flow done: prefill KV load",
    "_out_done": "flow done: KV out to the DE",
    "_h2d_done": "flow done: H2D on the DE",
    "_done": "flow done: persist write (pipe)",
    "_sample": "queue samples (-o only)",
    "_fail": "node failure",
    "_recover": "node recovery",
}
HEAP = "kernel heap (pops, cancelled entries)"


def _phase(callback: Any, args: tuple[Any, ...]) -> str:
    name = getattr(callback, "__name__", repr(callback))
    if name == "_group_due":  # a flow group's completion: name it by its earliest flow's callback
        live = [flow for flow in args[0].queued() if flow.active]
        if live:
            name = getattr(min(live, key=lambda f: f._tag).on_done, "__name__", name)
    return PHASES.get(name, name)


def timed_run(sim: Simulation) -> tuple[dict[str, int], dict[str, int]]:
    """`Simulator.run()` of `sim` (to the end, no horizon) with each callback's CPU time charged to its
    phase: (calls, CPU ns) per phase. Same pops and calls in the same order as the kernel's loop, with the
    kernel's own pop (it keeps each entry's `Event.pos`, which `Simulator.move` needs)."""
    kernel = sim.sim
    heap = kernel._heap
    calls: dict[str, int] = defaultdict(int)
    cpu_ns: dict[str, int] = defaultdict(int)
    clock = time.thread_time_ns
    now, inf = kernel.now_s, float("inf")
    use_huge_page_arenas()  # as `Simulation.run` (sim/huge_pages.py)
    with held_back_gc():
        while True:
            time_s = heap[0].time_s if heap else inf
            if time_s > now and kernel._instant_end_first is not None:
                callbacks = [kernel._instant_end_first, *kernel._instant_end]  # `Simulator._end_instant`
                kernel._instant_end_first, kernel._instant_end = None, []
                for callback in callbacks:
                    phase = _phase(callback, ())
                    t0 = clock()
                    callback()
                    cpu_ns[phase] += clock() - t0
                    calls[phase] += 1
                continue
            if not heap:
                break
            t0 = clock()
            entry = heap_pop(heap)
            cpu_ns[HEAP] += clock() - t0
            callback = entry.callback
            if callback is None:
                kernel._dead -= 1
                continue
            entry.callback = None
            kernel.now_s = now = time_s
            phase = _phase(callback, entry.arguments)
            t0 = clock()
            callback(*entry.arguments)
            cpu_ns[phase] += clock() - t0
            calls[phase] += 1
            kernel.events_processed += 1
    return dict(calls), dict(cpu_ns)


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
                  f"events {kernel.events_processed:11d}  requests {sim.num_requests:8d}  "
                  f"agents done {done}/{len(sim.agents)}", file=sys.stderr, flush=True)  # fmt: skip

    return tick


def case(p: int, d: int, agents: int, mode: str, progress_every_s: float = 0.0, phases: bool = False) -> dict[str, Any]:  # fmt: skip
    cluster = load_cluster(hardware="hopper-8x400g", model="deepseek-v3.2", num_prefill_nodes=p,
                           num_decode_nodes=d, overrides=[])  # fmt: skip
    trajectories = load_trajectories("64k", agents, 1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sim = Simulation(SimConfig(cluster=cluster, mode=mode), trajectories, seed=1)
    table = None
    if phases:
        calls, cpu_ns = timed_run(sim)
        table = {k: {"calls": calls.get(k, 0), "cpu_s": cpu_ns[k] / 1e9} for k in cpu_ns}
        out = sim.run()  # nothing left to run: collects the outcome
    else:
        out = sim.run(_progress_line(sim, wall0, progress_every_s) if progress_every_s > 0 else None)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finished = [a.end_s for a in out.agents if a.end_s == a.end_s]
    row: dict[str, Any] = {
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
        "cpu_us_per_event": 1e6 * cpu / max(1, out.events),
        "events_per_request": out.events / max(1, len(out.requests)),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "huge_page_arenas": arena_stats(),  # None: not built; its "installed": False with DUALPATH_HUGE_PAGES=0
        "anon_huge_page_bytes": anon_huge_page_bytes(),  # at the end of the run
        "load_average": os.getloadavg(),
    }
    if table is not None:
        row["phases"] = table
    return row


def _print(row: dict[str, Any]) -> None:
    print(f"{'case':<52} {'wall s':>8} {'cpu s':>8} {'events':>10} {'ev/s':>8} {'µs/ev':>6} {'ev/req':>7} "
          f"{'peak MB':>8} {'JCT s':>8}")  # fmt: skip
    print(f"{row['case']:<52} {row['wall_s']:8.1f} {row['cpu_s']:8.1f} {row['events']:10d} "
          f"{row['events_per_s']:8.0f} {row['cpu_us_per_event']:6.2f} {row['events_per_request']:7.1f} "
          f"{row['peak_rss_bytes'] / 1e6:8.0f} {row['jct_s'] or float('nan'):8.0f}")  # fmt: skip
    phases = row.get("phases")
    if phases:
        total = sum(v["cpu_s"] for v in phases.values()) or 1.0
        print(
            f"\n{'phase (CPU time of its callbacks)':<44} {'calls':>10} {'cpu s':>8} {'share':>6} {'µs/call':>8}"
        )
        for name, v in sorted(phases.items(), key=lambda kv: -kv[1]["cpu_s"]):
            per = f"{1e6 * v['cpu_s'] / v['calls']:8.2f}" if v["calls"] else f"{'-':>8}"
            print(f"{name:<44} {v['calls']:10d} {v['cpu_s']:8.2f} {100 * v['cpu_s'] / total:5.1f}% {per}")
    print(f"{row['machine']}, load average {row['load_average'][0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="the 48P96D 48K-agent run instead of 2P4D 2K")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of agents (and nodes) to run")
    ap.add_argument("--mode", default="dualpath")
    ap.add_argument("--phases", action="store_true", help="time each phase of the event loop (module doc)")
    ap.add_argument("--progress-every", type=float, default=0.0, metavar="S",
                    help="a progress line on stderr every S seconds of wall time (0: none)")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sim_speed.json"),
                    help="append the row to this JSON file ('' : do not)")  # fmt: skip
    a = ap.parse_args()
    p, d, agents = (48, 96, 49_152) if a.large else (2, 4, 2048)
    if a.large and a.scale != 1.0:
        p = max(2, round(p * a.scale))
        d, agents = 2 * p, 1024 * p
    row = case(p, d, agents, a.mode, a.progress_every, a.phases)
    row["scale"] = a.scale
    row["machine"] = (
        f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}"
    )
    if a.json:
        print(json.dumps(row, indent=2, sort_keys=True))
    else:
        _print(row)
    if a.out:
        out = Path(a.out)
        results = json.loads(out.read_text()) if out.exists() else {}
        results[row["case"] + (" (phases)" if a.phases else "")] = row
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
