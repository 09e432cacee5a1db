"""Instructions the simulator's event loop executes, counted by valgrind's callgrind: a speed figure
that does not drift with the host.

Wall and CPU time on a shared 2-vCPU host drift by ±15–30 % between minutes (benchmarks/README.md),
so a change worth a few per cent needs many interleaved runs to show. The number of instructions a
run executes is the same on every run of the same build and inputs, whatever else the machine does
(valgrind counts them on its simulated CPU, with Python's string hashing seeded; it does not see cache
misses or branch mispredictions, so it is a proxy for CPU time, not a replacement). Only the event loop is counted (`--toggle-collect` on the native build's
`Simulator.run`): imports, trajectory loading and the summary are left out.

The case is `dualpath simulate` of DS-V3.2 on hopper-8x400g, 64K dataset, offline, by default 2P4D with
64 agents in dualpath mode (≈ 75 s under callgrind, ≈ 50× the run alone). Needs the native build (a
pure-Python run has no `Simulator.run` frame to count from: it is refused) and valgrind (Debian's
package). To compare two builds, run it once per build, each with its tree first on PYTHONPATH.

`--cache-bytes N` also simulates the caches (callgrind's `--cache-sim`: 32 KiB L1s and a last-level
cache of N bytes, 16-way, 64-byte lines) and counts the loop's data misses there. A larger cluster's
loop costs more per event at nearly the same instructions because its live state outgrows the caches
(benchmarks/README.md); a last level far smaller than the host's lets a small run show the same
effect, deterministically. The simulated cache is a model (no prefetcher, no hardware's replacement
policy): compare builds with it, not with the host's times.

Prints a table, or one JSON object with `--json`; appends the row to `--out` (default
`benchmarks/results/sim_instructions.json`) unless `--out ''`.
Usage: python benchmarks/sim_instructions.py [--agents 64] [--p 2] [--d 4] [--mode dualpath]
       [--cache-bytes N] [--json] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The native build's C name of `Simulator.run` (mypyc: CPyDef_<module>___<class>___<method>).
EVENT_LOOP_SYMBOL = "CPyDef_kernel___Simulator___run"


def simulate_args(p: int, d: int, agents: int, mode: str) -> list[str]:
    return [
        "simulate", "--hardware", "hopper-8x400g", "--model", "deepseek-v3.2", "--dataset", "64k",
        "--p", str(p), "--d", str(d), "--agents", str(agents), "--mode", mode, "--json", "--quiet",
    ]  # fmt: skip


def collected(stderr: str) -> dict[str, int]:
    """The `Events : …` and `Collected : …` lines callgrind prints at exit: each event's count inside
    the toggled function (`Ir`, the instructions; with `--cache-sim` also `DLmr`/`DLmw`, the data reads
    and writes that missed the last level, and more)."""
    names = re.findall(r"Events\s*:\s*([A-Za-z0-9 ]+)", stderr)
    found = re.findall(r"Collected\s*:\s*([\d ]+)", stderr)
    if not names or not found:
        raise RuntimeError(f"no 'Events'/'Collected' lines in callgrind's output:\n{stderr[-2000:]}")
    return dict(zip(names[-1].split(), (int(v) for v in found[-1].split()), strict=True))


def count(p: int, d: int, agents: int, mode: str, cache_bytes: int | None = None) -> dict[str, Any]:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind not found: `apt-get install valgrind` (Debian's package)")
    command = [sys.executable, "-m", "dualpath.cli.main", *simulate_args(p, d, agents, mode)]
    with tempfile.TemporaryDirectory() as tmp:
        grind = [valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out",
                 f"--toggle-collect={EVENT_LOOP_SYMBOL}"]  # fmt: skip
        if cache_bytes is not None:
            grind += ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", f"--LL={cache_bytes},16,64"]
        print(f"[sim_instructions] {p}P{d}D {agents} agents {mode} under callgrind (≈ 50× slower than alone"
              f"{', ≈ 120× with the caches' if cache_bytes is not None else ''})", file=sys.stderr, flush=True)  # fmt: skip
        started = time.perf_counter()
        # A fixed string-hash seed: with a random one, dict probes (and so the count) vary a little per run.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(grind + command, capture_output=True, text=True, check=False, env=env)
        wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    if not result.get("compiled"):
        raise SystemExit("this is the pure-Python build: only the native build's event loop can be counted")
    counts = collected(done.stderr)
    instructions = counts["Ir"]
    events, requests = int(result["events"]), int(result["requests"])
    row: dict[str, Any] = {
        "case": f"DS-V3.2 {p}P{d}D 64K {agents} agents offline {mode}",
        "p": p,
        "d": d,
        "agents": agents,
        "mode": mode,
        "instructions": instructions,
        "events": events,
        "requests": requests,
        "instructions_per_event": instructions / max(1, events),
        "instructions_per_request": instructions / max(1, requests),
        "jct_s": result.get("jct_s"),
        "callgrind_wall_s": wall_s,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, CPython {platform.python_version()}",
    }
    if cache_bytes is not None:
        row["cache_bytes"] = cache_bytes  # the simulated last level
        row["ll_read_misses"] = counts["DLmr"]
        row["ll_write_misses"] = counts["DLmw"]
        row["ll_misses_per_event"] = (counts["DLmr"] + counts["DLmw"]) / max(1, events)
    return row


def _print(row: dict[str, Any]) -> None:
    print(
        f"{'case':<46} {'instructions':>15} {'events':>9} {'instr/event':>12} {'instr/request':>14} {'JCT s':>9}"
    )
    print(f"{row['case']:<46} {row['instructions']:15,d} {row['events']:9d} {row['instructions_per_event']:12,.0f} "
          f"{row['instructions_per_request']:14,.0f} {row['jct_s'] or float('nan'):9.1f}")  # fmt: skip
    if "cache_bytes" in row:
        print(f"last-level misses in a simulated {row['cache_bytes']:,d}-byte cache: {row['ll_read_misses']:,d} "
              f"reads, {row['ll_write_misses']:,d} writes, {row['ll_misses_per_event']:.2f} per event")  # fmt: skip
    print(f"{row['machine']}; callgrind took {row['callgrind_wall_s']:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--p", type=int, default=2)
    ap.add_argument("--d", type=int, default=4)
    ap.add_argument("--mode", default="dualpath")
    ap.add_argument("--cache-bytes", type=int, default=None,
                    help="also simulate a last-level cache of this many bytes and count the loop's misses")  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sim_instructions.json"),
                    help="append the row to this JSON list ('' to skip)")  # fmt: skip
    a = ap.parse_args()
    if a.agents < 1 or a.p < 1 or a.d < 1:
        ap.error("--agents, --p and --d must be >= 1")
    if a.cache_bytes is not None and (a.cache_bytes < 65536 or a.cache_bytes & (a.cache_bytes - 1)):
        ap.error("--cache-bytes must be a power of two of at least 65536 (valgrind's cache geometry)")
    row = count(a.p, a.d, a.agents, a.mode, a.cache_bytes)
    if a.out:
        path = Path(a.out)
        rows = json.loads(path.read_text()) if path.exists() else []
        rows.append(row)
        path.write_text(json.dumps(rows, indent=2) + "\n")
    if a.json:
        print(json.dumps(row, indent=2, sort_keys=True))
    else:
        _print(row)


if __name__ == "__main__":
    main()
