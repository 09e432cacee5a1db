"""`dualpath advise`: the smallest P×D cluster that meets a latency SLO at a target load, per mode.

A search, not a grid. For one mode:

1. Prune without a run. Splits of n nodes are the (P, n − P) inside the planner's bottleneck-free P/D range
   (paper §4.2 eq. 9, `dualpath.plan.bounds.pd_range`): outside it some link is over capacity at full SNIC
   read rate. Of those, a split whose GPUs cannot hold the model's weights, or whose DEs cannot hold the
   workload's longest trajectory, is pruned by the same closed forms the simulator refuses it with
   (`Problem.cannot_run`: `sim.rates.hbm_kv_tokens`, `sim.driver.requests_fit_error`); it counts as a miss
   and is listed with its reason. Node counts without a split that can run are misses without a run.
2. n meets the SLO when one of its splits does (tried nearest the range's geometric centre first, `batch`
   at a time). From the smallest n with a split that can run, n grows by 1, 2, 4, … until one meets it,
   then bisects between the last that did not and the first that did. This assumes that a cluster with one
   more node, at its best split, never does worse: the verdict at n − 1 is then a measured "no" for every
   split of the range, which the result lists as evidence.
3. At the answer n every split is run; the recommendation is the split that meets the SLO with the most
   headroom (lowest max(TTFT p90 / target, TPOT p90 / target)). One more run of it records every link
   (`simulate -o`), and the link class with the highest mean utilisation is reported as the binding link.

The modes are searched side by side: each search is a generator of batches of runs (`search_steps`), and
`advise` runs the batches of all modes together on the workers, so neither waits for the other; a mode's
link-recording run starts as soon as its answer is known.

Every run stops as soon as its TTFT p90 is certain to exceed max(TTFT target, 4 s) (sim/early_stop.py
`TtftP90Watch`, a proof), and online runs (APS) also once clearly past it (on the mean TTFT; for the
right-skewed TTFT here a mean past the p90 target means a p90 past it too); a stopped run counts as
missing the SLO. The 4 s floor lets every target up to the paper's share cached runs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from tqdm import tqdm

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


def runs_anywhere(p: int, d: int) -> str | None:
    """`Problem.cannot_run` when nothing is known to rule a split out."""
    return None


@dataclass(frozen=True, kw_only=True)
class Problem:
    """What to size: one run template (model, hardware, workload, load) without P, D or mode."""

    template: RunSpec  # p, d and mode are replaced per run
    slo: Slo
    pd_range: PdRange
    gpus_per_node: int
    max_nodes: int = 64
    # Closed form, no run: why the split (P, D) cannot run at all (the model's weights or the longest
    # trajectory do not fit its GPUs' HBM), or None. Such a split is pruned and counts as a miss.
    cannot_run: Callable[[int, int], str | None] = runs_anywhere


@dataclass(kw_only=True)
class Evidence:
    spec: RunSpec
    result: dict | None
    error: str | None
    met: bool
    pruned: str | None = None  # why it was not run (closed form), None for a run

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
            "pruned": self.pruned,
            "stop_reason": r.get("stop_reason") if r else None,
            "key": None if self.pruned else self.spec.key(),
            "command": None if self.pruned else "dualpath " + " ".join(self.spec.argv()),
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


Outcomes = dict[str, RunOutcome]
Steps = Generator[list[RunSpec], Outcomes, ModeAnswer]


def lowest_nodes(problem: Problem) -> int | None:
    """The smallest node count with a split in the range that can run (closed form), None if none."""
    for n in range(2, problem.max_nodes + 1):
        if any(problem.cannot_run(p, d) is None for p, d in splits(n, problem.pd_range)):
            return n
    return None


def search_steps(problem: Problem, mode: str, *, start: int, batch: int, log: Callable[[str], None]) -> Steps:
    """The search of one mode (module docstring) as a generator: it yields the runs it needs next and is
    sent their outcomes (keyed by `RunSpec.key()`); it returns the mode's answer."""
    answer = ModeAnswer(mode=mode)
    seen: dict[RunSpec, Evidence] = {}

    def try_nodes(n: int, *, every_split: bool) -> Generator[list[RunSpec], Outcomes, bool]:
        todo = [replace(problem.template, p=p, d=d, mode=mode) for p, d in splits(n, problem.pd_range)]
        for spec in todo:
            why = None if spec in seen else problem.cannot_run(spec.p, spec.d)
            if why is not None:
                seen[spec] = ev = Evidence(spec=spec, result=None, error=None, met=False, pruned=why)
                answer.runs.append(ev)
                log(_describe(ev, problem.slo))
        runnable = [spec for spec in todo if seen.get(spec) is None or seen[spec].pruned is None]
        step = max(1, len(runnable) if every_split else batch)  # no split of n that runs: no chunk
        for i in range(0, len(runnable), step):
            chunk = runnable[i : i + step]
            wanted = [s for s in chunk if s not in seen]
            outcomes = (yield wanted) if wanted else {}
            for spec in wanted:
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

    lowest = lowest_nodes(problem)
    if lowest is None:
        return answer
    lo, n, grow = lowest - 1, max(start, lowest), 1  # lo: the largest n known to miss
    while not (yield from try_nodes(n, every_split=False)):
        lo = n
        if n >= problem.max_nodes:
            return answer
        n, grow = min(n + grow, problem.max_nodes), 2 * grow
    hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (yield from try_nodes(mid, every_split=False)):
            hi = mid
        else:
            lo = mid
    yield from try_nodes(hi, every_split=True)
    at_hi = [e for e in answer.runs if e.spec.p + e.spec.d == hi and e.met]
    answer.best = min(at_hi, key=lambda e: (problem.slo.headroom(e.result) or math.inf, e.spec.p))
    return answer


def search(
    problem: Problem, mode: str, run: Runner, *, start: int, batch: int, log: Callable[[str], None]
) -> ModeAnswer:
    """`search_steps` of one mode, each batch run by `run` as it comes."""
    steps = search_steps(problem, mode, start=start, batch=batch, log=log)
    try:
        wanted = next(steps)
        while True:
            wanted = steps.send(run(wanted))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _describe(ev: Evidence, slo: Slo) -> str:
    s, r = ev.spec, ev.result
    if ev.pruned is not None:
        return f"  {s.mode:<9} {s.p}P{s.d}D  pruned, not run: {ev.pruned}"
    if r is None:
        return f"  {s.mode:<9} {s.p}P{s.d}D  failed: {ev.error}"
    ttft, tpot = metric(r, "ttft_s", "p90"), metric(r, "tpot_s", "p90")
    stop = " (stopped early)" if r.get("stopped_early") else ""
    verdict = "meets" if ev.met else "misses"
    tpot_text = "-" if tpot is None else f"{tpot * 1000:.1f} ms"
    ttft_text = "-" if ttft is None else f"{ttft:.2f} s"
    return f"  {s.mode:<9} {s.p}P{s.d}D  TTFT p90 {ttft_text}, TPOT p90 {tpot_text}: {verdict} the SLO{stop}"


# ---------------------------------------------------------------- the binding link of a run


BINDING_TIME_SHARE = 0.25  # share of the run at >= 95 % of capacity for a link to count as binding

_CLASSES = {"snic_rx": ("SNIC read", "snic"), "snic_tx": ("SNIC write", "snic"), "dram": ("DRAM", "dram"),
            "read": ("CNIC read", "cnic"), "write": ("CNIC write", "cnic"), "down": ("PCIe H2D", "pcie"),
            "up": ("PCIe D2H", "pcie")}  # fmt: skip


def binding_link(result: dict[str, Any] | None, num_prefill_nodes: int) -> dict[str, Any] | None:
    """The chosen run's own link record (`simulate --link-summary`), ranked; None without one."""
    utilisation = (result or {}).get("link_utilisation")
    return None if not utilisation else rank_links(utilisation, num_prefill_nodes)


def rank_links(utilisation: dict[str, list[float]], num_prefill_nodes: int) -> dict[str, Any]:
    """Per link class (PE/DE side × SNIC, DRAM, CNIC, PCIe; storage): the busiest instance's mean
    utilisation over the run and the share of time it ran at ≥ 95 % of capacity (`utilisation`: per link
    name [mean utilisation, share of time at ≥ 95 %], the run's `link_utilisation`)."""
    classes: dict[str, tuple[float, float]] = {}
    for name, (mean, busy) in utilisation.items():
        label = _classify(name, num_prefill_nodes)
        classes[label] = max(classes.get(label, (0.0, 0.0)), (mean, busy))
    ranked = sorted(classes.items(), key=lambda kv: -kv[1][0])
    table = [
        {"link": k, "mean_utilisation": round(m, 4), "time_at_95pct": round(b, 4)} for k, (m, b) in ranked
    ]
    # A link binds when it runs at capacity for a good part of the run; else the point is bound elsewhere
    # (prefill compute, decode HBM or compute) and the busiest link is only reported.
    binds = bool(table) and table[0]["time_at_95pct"] >= BINDING_TIME_SHARE
    return {"link": table[0]["link"] if binds else None, "links": table[:6]}


def _classify(name: str, num_prefill_nodes: int) -> str:
    if name.startswith("storage_"):
        return f"storage {name.removeprefix('storage_')}"
    node, _, link = name.partition("/")
    side = "PE" if int(node.removeprefix("node")) < num_prefill_nodes else "DE"
    key = link if link in _CLASSES else link.rsplit("_", 1)[-1]
    return f"{side} {_CLASSES[key][0]}"


# ---------------------------------------------------------------- the whole answer


class AdviseProgress:
    """The progress bar of a search: runs done, and per mode the best answer so far (the fewest nodes whose
    run met the SLO, its split), or the answer once its search ended. Run lines print above the bar."""

    def __init__(self, modes: Sequence[str], slo: Slo, *, enabled: bool, log: Callable[[str], None]) -> None:
        self.slo, self.enabled, self.log = slo, enabled, log
        self.best: dict[str, tuple[int, float, str] | None] = {mode: None for mode in modes}
        self.final: dict[str, str] = {}
        self.bar = tqdm(desc="advise", unit=" run", file=sys.stderr, disable=not enabled,
                        bar_format="{desc}: {n} runs, {elapsed}{postfix}")  # fmt: skip
        self._show()

    def write(self, line: str) -> None:
        if self.enabled:
            self.bar.write(line, file=sys.stderr)
        else:
            self.log(line)

    def ran(self, outcome: RunOutcome) -> None:
        spec, headroom = outcome.spec, self.slo.headroom(outcome.result)
        if headroom is not None and headroom <= 1.0 and spec.mode in self.best:
            here = (spec.p + spec.d, headroom, f"{spec.p}P{spec.d}D")
            best = self.best[spec.mode]
            if best is None or here[:2] < best[:2]:
                self.best[spec.mode] = here
        self.bar.update()
        self._show()

    def answered(self, answer: ModeAnswer) -> None:
        b = answer.best
        self.final[answer.mode] = (
            "none" if b is None else f"{b.spec.p}P{b.spec.d}D ({b.spec.p + b.spec.d} nodes)"
        )
        self._show()

    def _show(self) -> None:
        parts = []
        for mode, best in self.best.items():
            if mode in self.final:
                parts.append(f"{mode}: {self.final[mode]}")
            else:
                parts.append(
                    f"{mode}: " + ("searching" if best is None else f"<= {best[0]} nodes ({best[2]})")
                )
        self.status = " | ".join(parts)
        self.bar.set_postfix_str(self.status, refresh=True)

    def close(self) -> None:
        self.bar.close()


def advise(problem: Problem, modes: Sequence[str], out_dir: Path, *, workers: int, ray_address: str | None,
           log: Callable[[str], None], progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """Every mode's search side by side (module docstring): each round runs the batches all searches want
    next together."""
    bar = AdviseProgress(modes, problem.slo, enabled=progress, log=log)
    batch = max(1, workers // max(1, len(modes)))
    steps = {mode: search_steps(problem, mode, start=2, batch=batch, log=bar.write) for mode in modes}
    pending: dict[str, list[RunSpec]] = {}
    answers: dict[str, ModeAnswer] = {}

    def advance(mode: str, outcomes: Outcomes | None) -> None:
        try:
            pending[mode] = next(steps[mode]) if outcomes is None else steps[mode].send(outcomes)
        except StopIteration as done:
            pending.pop(mode, None)
            answers[mode] = best = done.value
            if best.best is not None:
                best.binding = binding_link(best.best.result, best.best.spec.p)
            bar.answered(best)

    try:
        for mode in modes:
            advance(mode, None)
        while pending:
            wanted = list({spec.key(): spec for specs in pending.values() for spec in specs}.values())
            outcomes = run_all(wanted, out_dir / "runs", workers=workers, progress=False,
                               ray_address=ray_address, on_outcome=bar.ran)  # fmt: skip
            for mode in list(pending):
                advance(mode, outcomes)
    finally:
        bar.close()
    return report(problem, {mode: answers[mode] for mode in modes})


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
    out["simulations"] = sum(1 for a in answers.values() for e in a.runs if e.pruned is None)
    out["pruned_without_a_run"] = sum(1 for a in answers.values() for e in a.runs if e.pruned is not None)
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
    lines.append(
        f"{result['simulations']} simulations, {result['pruned_without_a_run']} splits pruned without one"
    )
    return "\n".join(lines)
