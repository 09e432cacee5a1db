"""The `simulate --json` object and the `-o DIR` files, from a finished simulation.

Minimal local metrics code: `dualpath.metrics` (shared RequestRecord, writers, plots) had not landed
when this was written; switch to it when it does.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from dualpath.sim.driver import SimOutcome
from dualpath.sim.links import resample_utilisation

TTFT_SLO_S = 4.0  # paper §7.1
TPOT_SLO_S = 0.050  # paper §7.1


def stats(values: list[float]) -> dict[str, float]:
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if v.size == 0:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarise(o: SimOutcome, *, offline: bool, wall_s: float) -> dict[str, Any]:
    reqs = [r for r in o.requests.values() if not math.isnan(r.first_token_s)]
    ttft = [r.first_token_s - r.arrival_s for r in reqs]
    ttst = [r.second_token_s - r.arrival_s for r in reqs]
    # TPOT: mean time per output token after the first, (last - first) / (gen - 1).
    tpot = {id(r): (r.last_token_s - r.first_token_s) / (r.gen_tokens - 1) for r in reqs if r.gen_tokens > 1}
    ok = sum(
        1 for r, f in zip(reqs, ttft, strict=True) if f <= TTFT_SLO_S and tpot.get(id(r), 0.0) <= TPOT_SLO_S
    )
    finished = [a.end_s for a in o.agents if not math.isnan(a.end_s)]
    snic = [n.snic_rx.bytes_carried(o.end_s) + n.snic_tx.bytes_carried(o.end_s) for n in o.topology.nodes]
    out: dict[str, Any] = {
        "jct_s": max(finished) if offline and len(finished) == len(o.agents) else None,
        "agent_jct_s": stats([a.end_s - a.start_s for a in o.agents if not math.isnan(a.end_s)]),
        "agents_finished": len(finished),
        "requests": len(reqs),
        "ttft_s": stats(ttft),
        "ttst_s": stats(ttst),
        "tpot_s": stats(list(tpot.values())),
        "slo_attainment": ok / len(reqs) if reqs else None,
        "snic_bytes": snic,
        "snic_max_over_avg": max(snic) / (sum(snic) / len(snic)) if sum(snic) else None,
        "de_read_fraction": _de_fraction(o),
        "sim_end_s": o.end_s,
        "sim_wall_s": wall_s,
        "events": o.events,
    }
    return out


def _de_fraction(o: SimOutcome) -> float | None:
    total = sum(a.pe_read_tokens + a.de_read_tokens for a in o.log.assignments)
    return sum(a.de_read_tokens for a in o.log.assignments) / total if total else None


def write_outputs(o: SimOutcome, summary: dict[str, Any], config: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    with (out_dir / "requests.jsonl").open("w") as f:
        for rid, r in sorted(o.requests.items()):
            f.write(json.dumps({"request_id": rid, **vars(r)}) + "\n")
    step = max(o.end_s / 200, 1e-3)
    links = {name: link for name, link in o.topology_links().items() if link.utilisation_record()}
    with (out_dir / "links.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["link", "start_s", "rate_bytes_per_s"])
        series = {}
        for name, link in sorted(links.items()):
            series[name] = resample_utilisation(link.utilisation_record(), 0.0, o.end_s, step)
            for t, rate in series[name]:
                w.writerow([name, round(t, 6), rate])
    _plots(o, series, step, out_dir)


def _plots(o: SimOutcome, series: dict[str, Any], step: float, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for name, rates in series.items():
        if "snic" in name and max((r for _, r in rates), default=0.0) > 0:
            ax.plot([t for t, _ in rates], [r / 1e9 for _, r in rates], label=name, lw=0.8)
    ax.set(xlabel="time (s)", ylabel="GB/s", title="SNIC utilisation")
    ax.legend(fontsize=6)
    fig.savefig(out_dir / "snic_utilisation.png", dpi=120)
    plt.close(fig)
    reqs = sorted(o.requests.values(), key=lambda r: r.arrival_s)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([r.arrival_s for r in reqs], [r.first_token_s - r.arrival_s for r in reqs], ".", ms=1)
    ax.set(xlabel="arrival (s)", ylabel="TTFT (s)", title="TTFT over time")
    fig.savefig(out_dir / "ttft.png", dpi=120)
    plt.close(fig)
    if o.queue_samples:
        t, waiting, reading = zip(*o.queue_samples, strict=True)
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.plot(t, waiting, label="waiting in scheduler")
        ax.plot(t, reading, label="read_q tokens / 1e6 (all nodes)")
        ax.set(xlabel="time (s)", title="queues")
        ax.legend()
        fig.savefig(out_dir / "queues.png", dpi=120)
        plt.close(fig)
