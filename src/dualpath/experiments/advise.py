"""`dualpath advise`: the smallest P×D cluster that meets a latency SLO at a target load, per mode.

A search, not a grid (issue 19). For one mode:

1. Splits of n nodes are the (P, n − P) inside the planner's bottleneck-free P/D range (paper §4.2 eq. 9,
   `dualpath.plan.bounds.pd_range`): outside it some link is over capacity at full SNIC read rate, so
   those splits are pruned without a run. Inside it they are tried nearest the range's geometric centre
   first, `workers` at a time (each a cached `dualpath simulate` run).
2. n meets the SLO when one of its splits does. Node counts double from a start until one meets it, then
   bisect between the last that did not and the first that did. This assumes that a cluster with one more
   node, at its best split, never does worse: the verdict at n − 1 is then a measured "no" for every split
   of the range, which the result lists as evidence.
3. At the answer n every split is run; the recommendation is the split that meets the SLO with the most
   headroom (lowest max(TTFT p90 / target, TPOT p90 / target)). One more run of it records every link
   (`simulate -o`), and the link class with the highest mean utilisation is reported as the binding link.

Online runs (APS) stop early once clearly past max(TTFT target, 4 s) (sim/early_stop.py, on the mean
TTFT; a run whose mean TTFT exceeds the p90 target has, for the right-skewed TTFT here, a p90 past it too)
and then count as missing the SLO; the 4 s floor lets every target up to the paper's share cached runs.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from dualpath.experiments.runner import RunOutcome, run_all
from dualpath.experiments.runspec import RunSpec
from dualpath.experiments.scenarios import metric
from dualpath.plan.bounds import PdRange


@dataclass(frozen=True, kw_only=True)
class Slo:
    ttft_p90_s: float
    tpot_p90_s: float | None = None

    def headroom(self, result: dict | None) -> float | None:
        """max(measured / target) over the SLO's terms: ≤ 1 meets it; None when the run did not."""
        if not result or result.get("stopped_early"):
            return None
        ttft, tpot = metric(result, "ttft_s", "p90"), metric(result, "tpot_s", "p90")
        if ttft is None or (self.tpot_p90_s is not None and tpot is None):
            return None
        terms = [ttft / self.ttft_p90_s]
        if self.tpot_p90_s is not None and tpot is not None:
            terms.append(tpot / self.tpot_p90_s)
        return max(terms)

    def met(self, result: dict | None) -> bool:
        h = self.headroom(result)
        return h is not None and h <= 1.0


@dataclass(frozen=True, kw_only=True)
class Problem:
    """What to size: one run template (model, hardware, workload, load) without P, D or mode."""

    template: RunSpec  # p, d and mode are replaced per run
    slo: Slo
    pd_range: PdRange
    gpus_per_node: int
    max_nodes: int = 64


@dataclass(kw_only=True)
class Evidence:
    spec: RunSpec
    result: dict | None
    error: str | None
    met: bool

    def row(self, slo: Slo) -> dict[str, Any]:
        r = self.result
        return {
            "p": self.spec.p,
            "d": self.spec.d,
            "nodes": self.spec.p + self.spec.d,
            "mode": self.spec.mode,
            "meets_slo": self.met,
            "ttft_p90_s": metric(r, "ttft_s", "p90"),
            "tpot_p90_s": metric(r, "tpot_s", "p90"),
            "ttft_mean_s": metric(r, "ttft_s"),
            "stopped_early": bool(r and r.get("stopped_early")),
            "headroom": slo.headroom(r),
            "error": self.error,
            "key": self.spec.key(),
            "command": "dualpath " + " ".join(self.spec.argv()),
        }


@dataclass(kw_only=True)
class ModeAnswer:
    mode: str
    best: Evidence | None = None  # the recommended split at the smallest node count
    nodes_checked: dict[int, bool] = field(default_factory=dict)  # n -> some split met the SLO
    runs: list[Evidence] = field(default_factory=list)
    binding: dict[str, Any] | None = None


Runner = Callable[[Sequence[RunSpec]], dict[str, RunOutcome]]


def splits(n: int, rng: PdRange) -> list[tuple[int, int]]:
    """(P, D) with P + D = n inside the bottleneck-free range, nearest its geometric centre first."""
    inside = [(p, n - p) for p in range(1, n) if rng.contains(p, n - p)]
    low = float(rng.pd_ratio_min) or 1 / 8
    high = float(rng.pd_ratio_max) if rng.pd_ratio_max is not None else 8.0
    centre = math.sqrt(low * high)
    return sorted(inside, key=lambda pd: (abs(math.log(pd[0] / pd[1] / centre)), pd[0]))


def search(
    problem: Problem, mode: str, run: Runner, *, start: int, batch: int, log: Callable[[str], None]
) -> ModeAnswer:
    """The smallest node count whose best split meets the SLO (module docstring)."""
    answer = ModeAnswer(mode=mode)
    seen: dict[RunSpec, Evidence] = {}

    def try_nodes(n: int, *, every_split: bool) -> bool:
        todo = [replace(problem.template, p=p, d=d, mode=mode) for p, d in splits(n, problem.pd_range)]
        step = max(1, len(todo) if every_split else batch)  # no split of n in the range: no chunk
        for i in range(0, len(todo), step):
            chunk = todo[i : i + step]
            outcomes = run([s for s in chunk if s not in seen])
            for spec in chunk:
                if spec not in seen:
                    o = outcomes.get(spec.key())
                    result = o.result if o else None
                    seen[spec] = ev = Evidence(spec=spec, result=result, error=o.error if o else "no result",
                                               met=problem.slo.met(result))  # fmt: skip
                    answer.runs.append(ev)
                    log(_describe(ev, problem.slo))
            if any(seen[s].met for s in chunk) and not every_split:
                break
        ok = any(seen[s].met for s in todo)
        answer.nodes_checked[n] = ok
        return ok

    lo, n = 1, max(2, start)  # lo: the largest n known to miss (1 node cannot hold P ≥ 1 and D ≥ 1)
    while not try_nodes(n, every_split=False):
        lo = n
        if n >= problem.max_nodes:
            return answer
        n = min(2 * n, problem.max_nodes)
    hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if try_nodes(mid, every_split=False):
            hi = mid
        else:
            lo = mid
    try_nodes(hi, every_split=True)
    at_hi = [e for e in answer.runs if e.spec.p + e.spec.d == hi and e.met]
    answer.best = min(at_hi, key=lambda e: (problem.slo.headroom(e.result) or math.inf, e.spec.p))
    return answer


def _describe(ev: Evidence, slo: Slo) -> str:
    s, r = ev.spec, ev.result
    if r is None:
        return f"  {s.mode:<9} {s.p}P{s.d}D  failed: {ev.error}"
    ttft, tpot = metric(r, "ttft_s", "p90"), metric(r, "tpot_s", "p90")
    stop = " (stopped early)" if r.get("stopped_early") else ""
    verdict = "meets" if ev.met else "misses"
    tpot_text = "-" if tpot is None else f"{tpot * 1000:.1f} ms"
    ttft_text = "-" if ttft is None else f"{ttft:.2f} s"
    return f"  {s.mode:<9} {s.p}P{s.d}D  TTFT p90 {ttft_text}, TPOT p90 {tpot_text}: {verdict} the SLO{stop}"


# ---------------------------------------------------------------- the binding link of a run


def binding_link(spec: RunSpec, out_dir: Path) -> dict[str, Any] | None:
    """Re-run `spec` recording every link (`simulate -o`) and rank link classes by mean utilisation."""
    folder = out_dir / "links" / spec.key()
    if not (folder / "links.csv").exists():
        command = [sys.executable, "-m", "dualpath.cli.main", *spec.argv(), "-o", str(folder)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not (folder / "links.csv").exists():
            return None
    config = json.loads((folder / "config.json").read_text())
    return rank_links(folder / "links.csv", config["cluster"], spec.p)


BINDING_TIME_SHARE = 0.25  # share of the run at >= 95 % of capacity for a link to count as binding

_CLASSES = {"snic_rx": ("SNIC read", "snic"), "snic_tx": ("SNIC write", "snic"), "dram": ("DRAM", "dram"),
            "read": ("CNIC read", "cnic"), "write": ("CNIC write", "cnic"), "down": ("PCIe H2D", "pcie"),
            "up": ("PCIe D2H", "pcie")}  # fmt: skip


def rank_links(links_csv: Path, cluster: dict[str, Any], num_prefill_nodes: int) -> dict[str, Any]:
    """Per link class (PE/DE side × SNIC, DRAM, CNIC, PCIe; storage): the busiest instance's mean
    utilisation over the run and the share of time it ran at ≥ 95 % of capacity."""
    hw = cluster["hardware"]
    capacity = {k: float(hw[f"{k}_bytes_per_s"]) for k in ("snic", "dram", "cnic", "pcie", "storage")}
    with links_csv.open() as f:
        rows = list(csv.DictReader(f))
    classes: dict[str, tuple[float, float]] = {}
    for column in rows[0] if rows else []:
        if not column.endswith("_bytes_per_s"):
            continue
        name = column.removesuffix("_bytes_per_s")
        label, cap = _classify(name, num_prefill_nodes, capacity)
        rates = [float(row[column]) for row in rows]
        mean = sum(rates) / len(rates) / cap
        busy = sum(r >= 0.95 * cap for r in rates) / len(rates)
        classes[label] = max(classes.get(label, (0.0, 0.0)), (mean, busy))
    ranked = sorted(classes.items(), key=lambda kv: -kv[1][0])
    table = [
        {"link": k, "mean_utilisation": round(m, 4), "time_at_95pct": round(b, 4)} for k, (m, b) in ranked
    ]
    # A link binds when it runs at capacity for a good part of the run; else the point is bound elsewhere
    # (prefill compute, decode HBM or compute) and the busiest link is only reported.
    binds = bool(table) and table[0]["time_at_95pct"] >= BINDING_TIME_SHARE
    return {"link": table[0]["link"] if binds else None, "links": table[:6]}


def _classify(name: str, num_prefill_nodes: int, capacity: dict[str, float]) -> tuple[str, float]:
    if name.startswith("storage_"):
        return f"storage {name.removeprefix('storage_')}", capacity["storage"]
    node, _, link = name.partition("/")
    side = "PE" if int(node.removeprefix("node")) < num_prefill_nodes else "DE"
    key = link if link in _CLASSES else link.rsplit("_", 1)[-1]
    label, kind = _CLASSES[key]
    return f"{side} {label}", capacity[kind]


# ---------------------------------------------------------------- the whole answer


def advise(problem: Problem, modes: Sequence[str], out_dir: Path, *, workers: int, ray_address: str | None,
           log: Callable[[str], None], links: bool = True) -> dict[str, Any]:  # fmt: skip
    def run(specs: Sequence[RunSpec]) -> dict[str, RunOutcome]:
        return run_all(specs, out_dir / "runs", workers=workers, progress=False, ray_address=ray_address)

    answers: dict[str, ModeAnswer] = {}
    start = 2
    for mode in modes:
        log(f"{mode}:")
        answers[mode] = search(problem, mode, run, start=start, batch=workers, log=log)
        if answers[mode].best is not None:
            start = answers[mode].best.spec.p + answers[mode].best.spec.d  # the next mode starts there
        if answers[mode].best is not None and links:
            answers[mode].binding = binding_link(answers[mode].best.spec, out_dir)
    return report(problem, answers)


def report(problem: Problem, answers: dict[str, ModeAnswer]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, a in answers.items():
        best = a.best
        n = None if best is None else best.spec.p + best.spec.d
        fewer = [] if n is None else [e.row(problem.slo) for e in a.runs if e.spec.p + e.spec.d == n - 1]
        out[mode] = {
            "p": None if best is None else best.spec.p,
            "d": None if best is None else best.spec.d,
            "nodes": n,
            "gpus": None if n is None else n * problem.gpus_per_node,
            "meets_slo": best is not None,
            "chosen_run": None if best is None else best.row(problem.slo),
            "splits_meeting_slo_at_nodes": [
                f"{e.spec.p}P{e.spec.d}D"
                for e in a.runs
                if n is not None and e.spec.p + e.spec.d == n and e.met
            ],  # fmt: skip
            "one_node_fewer": fewer,
            "binding_link": a.binding,
            "nodes_checked": {str(k): v for k, v in sorted(a.nodes_checked.items())},
            "runs": [e.row(problem.slo) for e in a.runs],
        }
        if best is None:
            out[mode]["note"] = f"no split of up to {problem.max_nodes} nodes met the SLO"
    t = problem.template
    nd, nb = (out.get(m, {}).get("nodes") for m in ("dualpath", "basic"))
    saving = None
    if nd is not None and nb is not None:
        saving = {"nodes": nb - nd, "gpus": (nb - nd) * problem.gpus_per_node, "fraction": (nb - nd) / nb}
    out["saving"] = saving
    rng = problem.pd_range
    out["problem"] = {
        "hardware": t.hardware, "model": t.model, "dataset": t.dataset, "aps": t.aps, "agents": t.agents,
        "duration_s": t.duration_s, "overrides": list(t.overrides), "seed": t.seed,
        "slo": {"ttft_p90_s": problem.slo.ttft_p90_s, "tpot_p90_s": problem.slo.tpot_p90_s},
        "pd_range": [_frac(rng.pd_ratio_min), None if rng.pd_ratio_max is None else _frac(rng.pd_ratio_max)],
        "gpus_per_node": problem.gpus_per_node,
    }  # fmt: skip
    out["simulations"] = sum(len(a.runs) for a in answers.values())
    return out


def _frac(x: Fraction) -> float:
    return round(float(x), 6)


def render(result: dict[str, Any]) -> str:
    p = result["problem"]
    load = f"{p['aps']:g} APS for {p['duration_s']:g} s" if p["aps"] is not None else f"{p['agents']} agents"
    slo = f"TTFT p90 <= {p['slo']['ttft_p90_s']:g} s"
    if p["slo"]["tpot_p90_s"] is not None:
        slo += f", TPOT p90 <= {p['slo']['tpot_p90_s'] * 1000:g} ms"
    lines = [f"{p['model']} on {p['hardware']}, {p['dataset']}, {load}; SLO {slo}",
             f"P/D searched inside the planner's bottleneck-free range {p['pd_range'][0]:g} .. "
             f"{p['pd_range'][1] if p['pd_range'][1] is not None else 'inf'}", ""]  # fmt: skip
    for mode in (m for m in result if isinstance(result[m], dict) and "chosen_run" in result[m]):
        a = result[mode]
        if not a["meets_slo"]:
            lines.append(f"{mode:<9} {a['note']}")
            continue
        c = a["chosen_run"]
        lines.append(f"{mode:<9} {a['p']}P{a['d']}D = {a['nodes']} nodes ({a['gpus']} GPUs): TTFT p90 "
                     f"{c['ttft_p90_s']:.2f} s, TPOT p90 {c['tpot_p90_s'] * 1000:.1f} ms")  # fmt: skip
        if a["binding_link"] and a["binding_link"]["links"]:
            top = a["binding_link"]["links"][0]
            what = "binding link" if a["binding_link"]["link"] else "no link binds; busiest"
            lines.append(f"{'':<9} {what}: {top['link']} (mean utilisation {top['mean_utilisation']:.0%}, "
                         f"{top['time_at_95pct']:.0%} of the time at >= 95 %)")  # fmt: skip
        misses = ", ".join(f"{e['p']}P{e['d']}D" for e in a["one_node_fewer"])
        fewer = f"{misses} all miss the SLO" if misses else "none (2 nodes is the smallest cluster)"
        lines.append(f"{'':<9} one node fewer: {fewer}")
        lines.append(f"{'':<9} evidence: {c['command']}")
    if result["saving"]:
        s = result["saving"]
        nodes = "node" if s["nodes"] == 1 else "nodes"
        lines.append(
            f"\nDualPath saves {s['nodes']} {nodes} ({s['gpus']} GPUs, {s['fraction']:.0%}) over basic"
        )
    lines.append(f"{result['simulations']} simulations")
    return "\n".join(lines)
