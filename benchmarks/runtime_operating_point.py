"""The twin's map of `runtime_paths.py`'s operating point: both ratios over the design load and the trace length.

`runtime_paths.py` sets the SNIC rate so that DualPath's three SNICs would be rho-busy over an Oracle-long
run (rate = hit bytes / (3 x rho x Oracle JCT)). Its trace starts from an empty store, so each agent's first
round reads nothing and computes its whole prompt; every read falls in the later rounds. With few rounds
the first one is a large share of the Oracle run, and over the rounds that read the SNICs are loaded to
rho / (1 - that share), above 1 at the default 5 rounds and rho 0.8. Then DualPath is storage-bound by the
trace's construction, not by the runtime's own cost, and raising rho buys gain over Basic with distance to
Oracle (rho 0.7 -> 0.8 at 5 rounds: basic/dualpath +0.07, dualpath/oracle +0.10 in the twin).

This script asks the calibrated twin (docs/twin.md: the simulator with this machine's measured costs,
within 15 % of the runtime on `dualpath validate`) for Basic, DualPath and Oracle on local-1p2d at each
(rounds, rho), with `runtime_paths.py`'s rule applied to the twin's own Oracle run, and prints per point:
the first round's share of the Oracle JCT, the SNIC load over the reading rounds, both ratios, and whether
they meet `runtime_paths.py`'s bars (basic/dualpath >= 2.0, dualpath/oracle <= 1.3). It runs no runtime:
a few seconds (plus a quick calibration the first time, cached like the demo's). The runtime's measured
figures for the same points are in benchmarks/README.md.

    python benchmarks/runtime_operating_point.py [--rounds 5 8 10] [--rho 0.6 0.7 0.8 0.9 1.0] [--json] [--plot F.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from runtime_paths import link_settings, snic_load_while_reading, snic_rate_bytes_per_s

from dualpath.runtime.bench import BenchOptions
from dualpath.runtime.cluster import RuntimeClusterSpec, apply_settings, load_cluster
from dualpath.twin.calibration import Calibration, load_calibration
from dualpath.twin.predict import predict
from dualpath.twin.validate import trace_rounds

# runtime_paths.py's bars (../shared/checks/runtime)
GAIN_BAR = 2.0  # basic/dualpath at least
ORACLE_BAR = 1.3  # dualpath/oracle at most


def predicted_point(
    spec: RuntimeClusterSpec, cal: Calibration, rounds: list[list[Any]], rho: float, oracle: dict[str, Any]
) -> dict[str, float]:
    """Basic and DualPath at the SNIC rate `runtime_paths.py` would set from this Oracle prediction."""
    hit_bytes = sum(d["rx"] for d in oracle["snic_bytes"].values())
    rate = snic_rate_bytes_per_s(hit_bytes, oracle["jct_s"], rho)
    paced = apply_settings(spec, link_settings(rate))
    basic = predict(paced, cal, "basic", rounds)[0]["jct_s"]
    dualpath = predict(paced, cal, "dualpath", rounds)[0]["jct_s"]
    return {
        "hit_bytes": hit_bytes,
        "snic_bytes_per_s": rate,
        "basic_jct_s": basic,
        "dualpath_jct_s": dualpath,
    }


def first_round_share(outcome: Any, jct_s: float) -> float:
    """Mean time from an agent's start to its first round's end (no hits: the store starts empty), over
    the Oracle JCT."""
    ends = [r.done_s for r in outcome.requests.values() if r.round_index == 0]
    return sum(ends) / len(ends) / jct_s


def sweep(cal: Calibration, args: argparse.Namespace, say: Any) -> list[dict[str, Any]]:
    spec = load_cluster("local-1p2d")
    points = []
    for num_rounds in args.rounds:
        options = BenchOptions(
            dataset="64k", agents=args.agents, max_rounds=num_rounds, context_scale=args.context_scale
        )
        trajectories = trace_rounds(options)
        oracle, outcome = predict(spec, cal, "oracle", trajectories)
        share = first_round_share(outcome, oracle["jct_s"])
        for rho in args.rho:
            say(f"rounds {num_rounds}, rho {rho:.2f} ...")
            point = predicted_point(spec, cal, trajectories, rho, oracle)
            gain, to_oracle = (
                point["basic_jct_s"] / point["dualpath_jct_s"],
                point["dualpath_jct_s"] / oracle["jct_s"],
            )
            points.append({
                "rounds": num_rounds, "rho": rho, "first_round_share": share,
                "reading_rounds_snic_load": snic_load_while_reading(rho, share), "oracle_jct_s": oracle["jct_s"], **point,
                "basic_over_dualpath": gain, "dualpath_over_oracle": to_oracle,
                "meets_bars": gain >= GAIN_BAR and to_oracle <= ORACLE_BAR,
            })  # fmt: skip
    return points


def table(points: list[dict[str, Any]]) -> str:
    head = (
        f"{'rounds':>6} {'rho':>5} {'1st round':>9} {'SNIC load':>9} {'SNIC MB/s':>9} {'oracle s':>8} "
        f"{'basic s':>8} {'dualpath s':>10} {'b/d':>5} {'d/o':>5}  bars"
    )
    lines = [head, "-" * len(head)]
    for p in points:
        lines.append(
            f"{p['rounds']:>6} {p['rho']:>5.2f} {100 * p['first_round_share']:>8.0f}% "
            f"{p['reading_rounds_snic_load']:>9.2f} {p['snic_bytes_per_s'] / 1e6:>9.2f} {p['oracle_jct_s']:>8.2f} "
            f"{p['basic_jct_s']:>8.2f} {p['dualpath_jct_s']:>10.2f} {p['basic_over_dualpath']:>5.2f} "
            f"{p['dualpath_over_oracle']:>5.2f}  {'met' if p['meets_bars'] else '-'}"
        )
    lines.append(
        "1st round: the first round's share of the Oracle JCT; SNIC load: rho over the rounds that read, "
        f"rho / (1 - share); bars: basic/dualpath >= {GAIN_BAR}, dualpath/oracle <= {ORACLE_BAR}"
    )
    return "\n".join(lines)


def plot(points: list[dict[str, Any]], path: Path) -> None:
    """Both ratios against rho, one line per trace length, the bars dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (gain_ax, oracle_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for num_rounds in sorted({p["rounds"] for p in points}):
        row = sorted((p for p in points if p["rounds"] == num_rounds), key=lambda p: p["rho"])
        rho = [p["rho"] for p in row]
        label = f"{num_rounds} rounds"
        gain_ax.plot(rho, [p["basic_over_dualpath"] for p in row], marker="o", label=label)
        oracle_ax.plot(rho, [p["dualpath_over_oracle"] for p in row], marker="o", label=label)
    for ax, bar, name in ((gain_ax, GAIN_BAR, "basic / dualpath JCT (at least)"),
                          (oracle_ax, ORACLE_BAR, "dualpath / oracle JCT (at most)")):  # fmt: skip
        ax.axhline(bar, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("design load rho (runtime_paths.py's rate rule)")
        ax.set_title(name)
        ax.legend()
    fig.suptitle("The calibrated twin on local-1p2d: runtime_paths.py's operating point")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, nargs="+", default=[5, 8, 10], help="trace lengths (default 5 8 10)"
    )
    parser.add_argument(
        "--rho", type=float, nargs="+", default=[0.6, 0.7, 0.8, 0.9, 1.0], help="design loads"
    )
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--context-scale", type=float, default=1 / 32)
    parser.add_argument(
        "--calibration", type=Path, help="a calibration file (default: the demo's cached one)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, help="also draw both ratios against rho here (PNG)")
    parser.add_argument("--out", default="benchmarks/results/runtime_operating_point.json",
                        help="write the JSON here too ('' : do not)")  # fmt: skip
    args = parser.parse_args(argv)
    if any(r < 2 for r in args.rounds) or args.agents < 1:
        parser.error("--rounds must be >= 2 (a first round reads nothing) and --agents >= 1")
    if any(not 0.0 < rho <= 1.0 for rho in args.rho):
        parser.error("--rho values must be in (0, 1]")
    say = (lambda _: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    if args.calibration is not None:
        if not args.calibration.is_file():
            parser.error(f"--calibration {args.calibration}: no such file")
        cal = load_calibration(args.calibration)
    else:
        from dualpath.cli.demo_twin import cached_calibration

        cal = cached_calibration("local-1p2d", say=say)
    started = time.monotonic()
    points = sweep(cal, args, say)
    out = {
        "machine": {
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "load_average_end": os.getloadavg(),
        },
        "cluster": "local-1p2d", "agents": args.agents, "context_scale": args.context_scale,
        "calibration": str(args.calibration) if args.calibration else "the demo's cached calibration",
        "points": points, "wall_s": time.monotonic() - started,
    }  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    if args.plot:
        plot(points, args.plot)
    print(json.dumps(out, indent=2) if args.json else table(points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
