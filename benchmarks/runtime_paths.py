"""Runtime benchmark: Basic vs DualPath vs Oracle on a real `local-1p2d` cluster, I/O-bound trace.

What it shows (paper §7.3, Fig. 7, on our emulated hardware): with 1 prefill node and 2 decode nodes there
are 3 SNICs, and Basic reads every hit through the PE's one SNIC, so on a storage-bound trace DualPath can
be up to 3x faster than Basic and, when 3 SNICs suffice, as fast as Oracle (which skips all I/O time).

The operating point is set, not tuned: the SNIC bandwidth is chosen so that the trace is storage-bound
with a theoretical gain of exactly 3x, at a design load rho of the storage links —

    storage time on ONE SNIC (Basic)  =  3 x rho x Oracle's JCT   (so 3 SNICs  =  rho x Oracle's JCT)

i.e. rate = (hit bytes the trace reads) / (3 x rho x Oracle JCT), both measured by Oracle runs on the same
machine (CPU speed differs between machines; the ratio is what the experiment is about). The CNIC keeps the
paper's ratio (node CNICs = 8 x SNIC, §2.3). Oracle's own JCT does not depend on the rates (it skips all I/O
time), so its runs are also samples of the Oracle row; Basic and DualPath then replay the same trace, each
run on a fresh cluster with an empty KV store. Every mode runs `--repeat` times and the means are reported.
The host may be shared with other work whose load drifts over minutes, and Oracle is pure CPU, so each
repeat runs Basic, DualPath and Oracle back to back and the Oracle row is the mean of ALL its runs (the
calibration runs first, then one beside each Basic/DualPath pair): an Oracle measured only at the start
would be compared with the other modes at another load.

Why rho = 0.8 by default, not 1: at rho = 1 the three SNICs are exactly as fast as the trace needs and only
a perfect pipeline with no idle moment on any SNIC could match Oracle (a queue at utilisation 1 never
drains); no storage tier is provisioned that way. 0.8 is the busy level the benchmark asks of every SNIC
while requests wait for reads; Basic is then still 3 x 0.8 = 2.4 x over its one SNIC's capacity.
`--design-load 1` gives the knife-edge point (measured figures for both are in benchmarks/README.md).

The individual runs are in the JSON, and each mode's rounds one by one (`rounds`: when each round was
sent, its latency, its milestones); without `--json` a table sets Oracle's rounds beside DualPath's, with
DualPath's read queue and read and its wait for a round's blocks to be persisted (the agent's next round
is sent then). A SNIC's utilisation is its bytes read over (its rate x the time the node had reads
waiting or in flight). Each run also keeps its SNICs' read rates over time (`read_timelines`: the
counters sampled every 0.5 s while the replay runs); `--plot F.png` draws Basic's and DualPath's first
run that way, beside Oracle's JCT.

    python benchmarks/runtime_paths.py [--json] [--plot F.png] [--agents N] [--rounds R] [--context-scale F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from dualpath.runtime.bench import BenchOptions
from dualpath.runtime.experiment import run_mode, snic_utilisation

STORAGE_GAIN = 3.0  # (P + D) / P SNICs for local-1p2d: the theoretical gain the trace is sized for
DESIGN_LOAD = 0.8  # rho: DualPath's three SNICs would be 80 % busy over an Oracle-long run (module doc)
CNIC_PER_SNIC = 8.0  # node CNICs together = 8 x the SNIC (paper §2.3: 8 x 400 Gbps vs 1 x 400 Gbps)


def snic_rate_bytes_per_s(hit_bytes: float, oracle_jct_s: float, design_load: float) -> float:
    """The rule of the module doc: DualPath's SNICs `design_load`-busy over an Oracle-long run."""
    return hit_bytes / (STORAGE_GAIN * design_load * oracle_jct_s)


def link_settings(snic_rate: float) -> list[str]:
    """`serve --set` values for that SNIC rate, the CNICs at the paper's ratio."""
    return [f"snic_bytes_per_s={snic_rate:.0f}", f"cnic_bytes_per_s={CNIC_PER_SNIC * snic_rate:.0f}"]


def snic_load_while_reading(design_load: float, first_round_share: float) -> float:
    """The store starts empty, so each agent's first round reads nothing: over the rounds that read, the
    SNICs carry the design load over what is left of Oracle's JCT (benchmarks/runtime_operating_point.py)."""
    return design_load / (1.0 - first_round_share)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def mean_by_key(maps: list[dict[str, float]]) -> dict[str, float]:
    """Each key's mean over the maps that have it, in the order first seen: a run that lacks a milestone
    leaves it out of that milestone's mean rather than counting it as 0 s."""
    keys = dict.fromkeys(k for m in maps for k in m)
    return {k: mean([m[k] for m in maps if k in m]) for k in keys}


def mode_result(summaries: list[dict]) -> dict:
    """Means over repeated runs of one mode (the host is shared; one run can catch a busy moment)."""

    nodes = sorted(summaries[0]["snic"])
    utils = [snic_utilisation(s) for s in summaries]
    return {
        "jct_s": mean([s["jct_s"] for s in summaries]),
        "ttft_mean_s": mean([s["ttft_s"]["mean"] for s in summaries]),
        "ttft_p90_s": mean([s["ttft_s"]["p90"] for s in summaries]),
        "tpot_mean_s": mean([s["tpot_s"]["mean"] for s in summaries]),
        "tokens_per_s": mean([s["tokens_per_s"] for s in summaries]),
        "snic_utilisation": {n: mean([u[n] for u in utils]) for n in nodes},
        "snic_read_bytes": {n: mean([s["snic"][n]["rx"] for s in summaries]) for n in nodes},
        "read_sides": summaries[0]["read_sides"],
        "runs_jct_s": [s["jct_s"] for s in summaries],
        # where a request's time goes: mean seconds from arrival to each server-side milestone
        "milestones_mean_s": mean_by_key([s["milestones_mean_s"] for s in summaries]),
        "rounds": rounds_result([s["rounds"] for s in summaries]),
        "read_timelines": [s["read_timeline"] for s in summaries],  # per run: their sample times differ
    }


def rounds_result(runs: list[list[dict]]) -> list[dict]:
    """Round by round (`bench.rounds_breakdown`), the means over repeated runs of one mode."""
    out = []
    for index, first in enumerate(runs[0]):
        same = [run[index] for run in runs]
        out.append(
            {
                "round": first["round"],
                "requests": first["requests"],
                "sent_mean_s": mean([r["sent_mean_s"] for r in same]),
                "latency_mean_s": mean([r["latency_mean_s"] for r in same]),
                "finished_after_last_token_mean_s": mean(
                    [r["finished_after_last_token_mean_s"] for r in same]
                ),
                "milestones_mean_s": mean_by_key([r["milestones_mean_s"] for r in same]),
            }
        )
    return out


def rounds_table(modes: dict[str, dict]) -> str:
    """Where each round's time goes, Oracle beside DualPath: when the round was sent (mean s since the
    start), its latency to the last token, DualPath's read queue and read (mean s after arrival), and its
    wait from the last token until the round's blocks were persisted (its next round is sent then)."""
    head = (
        f"{'round':>5} {'oracle sent':>12} {'latency':>8} {'dualpath sent':>14} {'latency':>8}"
        f" {'read queue':>11} {'read':>6} {'persisted':>10}"
    )
    lines = [head, "-" * len(head)]
    for oracle, dualpath in zip(modes["oracle"]["rounds"], modes["dualpath"]["rounds"], strict=True):
        m = dualpath["milestones_mean_s"]
        queue, read = m.get("read_start", 0.0), m.get("read_end", 0.0) - m.get("read_start", 0.0)
        persisted = dualpath["finished_after_last_token_mean_s"]
        lines.append(
            f"{oracle['round']:>5} {oracle['sent_mean_s']:>12.2f} {oracle['latency_mean_s']:>8.3f}"
            f" {dualpath['sent_mean_s']:>14.2f} {dualpath['latency_mean_s']:>8.3f}"
            f" {queue:>11.3f} {read:>6.3f} {persisted:>10.3f}"
        )
    return "\n".join(lines)


def plot(out: dict, path: Path) -> None:
    """Basic's and DualPath's SNIC reads over their first run, stacked by node (the `read_timeline` that
    `dualpath bench` samples), against what one SNIC and all of them carry at the set rate, with that
    run's JCT and Oracle's mean JCT: when the reads can start, and whether the SNICs then stay full."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rate_mb_per_s = out["snic_bytes_per_s"] / 1e6
    oracle_jct_s = out["modes"]["oracle"]["jct_s"]
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for ax, mode in zip(axes, ("basic", "dualpath"), strict=True):
        result = out["modes"][mode]
        timeline = result["read_timelines"][0]
        nodes = sorted(timeline["read_mb_per_s"])
        series = [timeline["read_mb_per_s"][node] for node in nodes]
        ax.stackplot(
            timeline["t_s"], series, labels=[f"SNIC {node}" for node in nodes], step="pre", alpha=0.8
        )
        for count, style in ((1, ":"), (len(nodes), "--")):
            ax.axhline(count * rate_mb_per_s, color="grey", linestyle=style, linewidth=1)
            label = f"{count} SNIC{'s' if count > 1 else ''}"
            ax.text(0.005, count * rate_mb_per_s, label, transform=ax.get_yaxis_transform(),
                    va="bottom", fontsize=8, color="grey")  # fmt: skip
        ax.axvline(oracle_jct_s, color="black", linestyle="--", linewidth=1, label="Oracle's mean JCT")
        ax.axvline(result["runs_jct_s"][0], color="black", linewidth=1, label="this run's JCT")
        ax.set_ylabel("read MB/s")
        ax.set_title(f"{mode}: first run, JCT {result['runs_jct_s'][0]:.2f} s")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds since the replay started")
    fig.suptitle(
        f"local-1p2d, SNIC {rate_mb_per_s:.2f} MB/s: basic/dualpath {out['basic_over_dualpath']:.2f},"
        f" dualpath/oracle {out['dualpath_over_oracle']:.2f}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--agents", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--context-scale", type=float, default=1 / 32)
    parser.add_argument("--dataset", default="64k")
    parser.add_argument(
        "--design-load",
        type=float,
        default=DESIGN_LOAD,
        help="rho, the SNICs' design utilisation (default 0.8)",
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per mode; results are means (default 2)")
    parser.add_argument("--plot", type=Path, help="also draw each mode's SNIC reads over its first run (PNG)")
    args = parser.parse_args(argv)
    if not 0.0 < args.design_load <= 1.0:
        parser.error("--design-load must be in (0, 1]")
    options = BenchOptions(
        dataset=args.dataset, agents=args.agents, max_rounds=args.rounds, context_scale=args.context_scale
    )
    progress = not args.json
    started = time.monotonic()
    load_start = os.getloadavg()
    log = print if progress else (lambda *a, **k: None)

    # Oracle moves its bytes unpaced, so its JCT does not depend on the link rates: its runs come first and
    # their mean JCT sets the SNIC rate (a mean, because one run on a shared host can catch a busy moment).
    runs: dict[str, list[dict]] = {
        "oracle": [run_mode("oracle", options, progress=progress) for _ in range(args.repeat)]
    }
    oracle_jct_s = sum(r["jct_s"] for r in runs["oracle"]) / args.repeat
    hit_bytes = sum(d["rx"] for d in runs["oracle"][0]["snic"].values())
    snic_rate = snic_rate_bytes_per_s(hit_bytes, oracle_jct_s, args.design_load)
    settings = link_settings(snic_rate)
    log(
        f"oracle JCT {oracle_jct_s:.2f} s, {hit_bytes / 1e6:.1f} MB of hits -> SNIC {snic_rate / 1e6:.2f} MB/s"
    )
    runs |= {"basic": [], "dualpath": []}
    for _ in range(args.repeat):
        for mode in ("basic", "dualpath", "oracle"):  # side by side: the same host load for all three
            runs[mode].append(run_mode(mode, options, settings=settings, progress=progress))
            log(f"{mode:9s} JCT {runs[mode][-1]['jct_s']:.2f} s")
    modes = {mode: mode_result(runs[mode]) for mode in ("basic", "dualpath", "oracle")}
    shares = [r["first_round_mean_s"] / r["jct_s"] for r in runs["oracle"]]
    first_round_share = sum(shares) / len(shares)

    out = {
        "machine": {
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "load_average_start": load_start,  # 1/5/15-minute host load: other work shares the cores
            "load_average_end": os.getloadavg(),
        },
        "cluster": "local-1p2d",
        "trace": {
            "dataset": args.dataset,
            "agents": args.agents,
            "rounds": args.rounds,
            "context_scale": args.context_scale,
        },
        "snic_bytes_per_s": snic_rate,
        "design_load": args.design_load,
        "oracle_calibration_jct_s": oracle_jct_s,  # mean of the first `repeat` Oracle runs: sets the rate
        "cnic_bytes_per_s": CNIC_PER_SNIC * snic_rate,
        "modes": modes,
        "first_round_share": first_round_share,  # mean first-round latency over Oracle's JCT
        "snic_load_while_reading": snic_load_while_reading(args.design_load, first_round_share),
        "basic_over_dualpath": modes["basic"]["jct_s"] / modes["dualpath"]["jct_s"],
        "dualpath_over_oracle": modes["dualpath"]["jct_s"] / modes["oracle"]["jct_s"],
        "wall_s": time.monotonic() - started,
    }
    if args.plot:
        plot(out, args.plot)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(rounds_table(modes))
        print(
            f"basic/dualpath {out['basic_over_dualpath']:.2f}x   dualpath/oracle {out['dualpath_over_oracle']:.2f}x"
            f"   first round {100 * first_round_share:.0f} % of Oracle's JCT, SNICs loaded to"
            f" {out['snic_load_while_reading']:.2f} while reads can happen"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
