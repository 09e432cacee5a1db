"""The `simulate --json` object and the `-o DIR` files, from a finished simulation.

Records, latency statistics, SLO attainment, SNIC balance and the writers come from the shared
`dualpath.metrics` library (the runtime reports through the same code), so the simulator and the
runtime define TTFT, TTST (second token − first token), TPOT and SLO attainment once.
"""

from __future__ import annotations

import json
import math
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from dualpath.metrics import (
    RequestRecord,
    snic_max_over_avg,
    summarize_latencies,
    write_records_jsonl,
    write_time_series_csv,
)
from dualpath.metrics.summary import DEFAULT_TPOT_SLO_S, DEFAULT_TTFT_SLO_S, summarize_array
from dualpath.sim.driver import RequestTimes, SimOutcome, run_end_s
from dualpath.sim.links import resample_utilisation

# TTFT components, in order; consecutive stamps of a request, so they sum to its TTFT.
TTFT_PARTS = ("schedule_wait", "read_wait", "read", "prefill_wait", "prefill")
# Fig. 14 by the run's progress: edges as fractions of the simulated time (early, while the system fills).
PROGRESS_EDGES = (0.0, 0.05, 0.2, 0.5, 0.8, 1.0)


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else x


def to_record(request_id: int, r: RequestTimes) -> RequestRecord:
    side = "none"
    if r.pe_read_tokens and r.de_read_tokens:
        side = "split"
    elif r.pe_read_tokens:
        side = "pe"
    elif r.de_read_tokens:
        side = "de"
    return RequestRecord(
        request_id=request_id,
        trajectory_id=r.agent,
        round_index=r.round_index,
        prompt_tokens=r.prompt_tokens,
        hit_tokens=r.hit_tokens,
        generated_tokens=r.gen_tokens,
        arrival_s=r.arrival_s,
        scheduled_s=_opt(r.scheduled_s),
        read_start_s=_opt(r.read_start_s),
        read_end_s=_opt(r.read_end_s),
        prefill_start_s=_opt(r.prefill_start_s),
        prefill_end_s=_opt(r.first_token_s),
        first_token_s=_opt(r.first_token_s),
        second_token_s=_opt(r.second_token_s),
        last_token_s=_opt(r.last_token_s),
        read_side=side,  # type: ignore[arg-type]
        pe_id=r.pe_engine if r.pe_engine >= 0 else None,
        de_id=r.de_engine if r.de_engine >= 0 else None,
    )


def ttft_parts_s(r: RequestTimes) -> tuple[float, ...] | None:
    """(schedule_wait, read_wait, read, prefill_wait, prefill) of one prefilled request.

    A request without a storage read (no hit, or oracle) has zero read_wait and read; prefill_wait
    covers the landing-space reservation and the PE's ready queue.
    """
    if math.isnan(r.first_token_s) or math.isnan(r.scheduled_s) or math.isnan(r.prefill_start_s):
        return None
    read_start = r.scheduled_s if math.isnan(r.read_start_s) else r.read_start_s
    read_end = read_start if math.isnan(r.read_end_s) else r.read_end_s
    stamps = (r.arrival_s, r.scheduled_s, read_start, read_end, r.prefill_start_s, r.first_token_s)
    return tuple(b - a for a, b in zip(stamps, stamps[1:], strict=False))


def ttft_breakdown_s(o: SimOutcome) -> dict[str, float] | None:
    return _ttft_breakdown(_Milestones(o))


# A request's milestones (`RequestTimes` fields) as one row of `_Milestones`' table.
_MILESTONE_FIELDS = ("arrival_s", "scheduled_s", "read_start_s", "read_end_s", "prefill_start_s",
                     "first_token_s", "second_token_s", "last_token_s")  # fmt: skip
_ROW = np.dtype([(name, np.float64) for name in _MILESTONE_FIELDS] + [("gen_tokens", np.int64)])
_ROW_FIELDS = attrgetter(*_MILESTONE_FIELDS, "gen_tokens")


class _Milestones:
    """Every request's milestones as float arrays (NaN: not reached), in the order of `o.requests`, which is
    request-id order (ids are handed out in arrival order); `order` sorts them by id if it were not.

    NOTE: the summary is computed from these arrays rather than from one `RequestRecord` per request (the
    records are built only for `-o` files): at 48P96D that is 7.8 M records. Every number is the same: the
    same float subtractions and divisions per request, the same values in the same order to numpy's
    percentile and mean, and the breakdown's means summed left to right as `sum` does. The columns are
    read in one pass over the requests (one row of `_ROW` per request): the records are spread over the
    heap, and a pass per column reached each one nine times (benchmarks/README.md).
    """

    def __init__(self, o: SimOutcome) -> None:
        n = len(o.requests)
        # `attrgetter` through `map`: no generator frame per request; one tuple per request, its row.
        rows = np.fromiter(map(_ROW_FIELDS, o.requests.values()), dtype=_ROW, count=n)
        ids = np.fromiter(o.requests.keys(), dtype=np.int64, count=n)
        self.order = None if n < 2 or bool(np.all(ids[1:] > ids[:-1])) else np.argsort(ids, kind="stable")
        self.arrival = rows["arrival_s"]
        self.scheduled = rows["scheduled_s"]
        self.read_start = rows["read_start_s"]
        self.read_end = rows["read_end_s"]
        self.prefill_start = rows["prefill_start_s"]
        self.first = rows["first_token_s"]
        self.second = rows["second_token_s"]
        self.last = rows["last_token_s"]
        self.gen = rows["gen_tokens"]

    def by_id(self, values: np.ndarray) -> np.ndarray:
        return values if self.order is None else values[self.order]


def _ttft_breakdown(m: _Milestones) -> dict[str, float] | None:
    """`ttft_parts_s` of every prefilled request, averaged per part (module `_Milestones` NOTE)."""
    ok = ~(np.isnan(m.first) | np.isnan(m.scheduled) | np.isnan(m.prefill_start))
    count = int(ok.sum())
    if not count:
        return None
    read_start = np.where(np.isnan(m.read_start), m.scheduled, m.read_start)
    read_end = np.where(np.isnan(m.read_end), read_start, m.read_end)
    stamps = [x[ok] for x in (m.arrival, m.scheduled, read_start, read_end, m.prefill_start, m.first)]
    return {
        name: _sum_in_order(b - a) / count for name, a, b in zip(TTFT_PARTS, stamps, stamps[1:], strict=False)
    }


def _sum_in_order(values: np.ndarray) -> float:
    """`sum(values.tolist())` of a non-empty array: the values added one by one, first to last, as
    `sum` adds a list of floats, without a float object per value (`np.cumsum` adds in order, where
    `np.sum` adds pairwise and may round differently)."""
    return float(np.cumsum(values)[-1])


def _latencies(m: _Milestones) -> dict[str, Any]:
    """TTFT, TTST, TPOT statistics and SLO attainment over the prefilled requests, in request-id order, as
    `RequestRecord`'s properties and `metrics.slo_attainment` define them (module `_Milestones` NOTE)."""
    first, last, gen = m.by_id(m.first), m.by_id(m.last), m.by_id(m.gen)
    prefilled = ~np.isnan(first)
    ttft = (first - m.by_id(m.arrival))[prefilled]
    second = m.by_id(m.second)
    ttst = (second - first)[prefilled & ~np.isnan(second)]
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot_all = (last - first) / (gen - 1)
    has_tpot = prefilled & ~np.isnan(last) & (gen >= 2)
    finished = ~np.isnan(last[prefilled])
    tpot_ok = ~has_tpot[prefilled] | (tpot_all[prefilled] <= DEFAULT_TPOT_SLO_S)
    meets = int((finished & (ttft <= DEFAULT_TTFT_SLO_S) & tpot_ok).sum())
    return {
        "requests": int(prefilled.sum()),
        "ttft_s": summarize_array(ttft),
        "ttst_s": summarize_array(ttst),
        "tpot_s": summarize_array(tpot_all[has_tpot]),
        "slo_attainment": meets / ttft.size if ttft.size else None,
    }


def summarise(o: SimOutcome, *, offline: bool, wall_s: float) -> dict[str, Any]:
    milestones = _Milestones(o)
    finished = [a.end_s for a in o.agents if not math.isnan(a.end_s)]
    # Fig. 13 compares what each SNIC *reads* from storage (the load DualPath spreads); the bytes a DE
    # writes back (persists) are the same in every mode and would dilute the comparison.
    snic_read = {str(i): n.snic_rx.bytes_carried(o.end_s) for i, n in enumerate(o.topology.nodes)}
    snic = {
        str(i): snic_read[str(i)] + n.snic_tx.bytes_carried(o.end_s) for i, n in enumerate(o.topology.nodes)
    }
    ratios, busy = o.attention_ratios, o.attention_ratios_busy
    end_s = run_end_s(o.agents, o.end_s)  # progress of the work, not of the loop (`-o` samples run on)
    latencies = _latencies(milestones)
    return {
        # Offline JCT (§7.2): when the last agent's last round is done (all agents start at t = 0).
        "jct_s": max(finished) if offline and len(finished) == len(o.agents) else None,
        "agent_jct_s": summarize_latencies(a.end_s - a.start_s for a in o.agents if not math.isnan(a.end_s)),
        "agents_finished": len(finished),
        "requests": latencies["requests"],
        "ttft_s": latencies["ttft_s"],
        "ttst_s": latencies["ttst_s"],
        "tpot_s": latencies["tpot_s"],
        "ttft_breakdown_s": _ttft_breakdown(milestones),
        "slo_attainment": latencies["slo_attainment"],
        "snic_bytes": snic,
        "snic_max_over_avg": snic_max_over_avg(snic) if sum(snic.values()) else None,
        "snic_read_bytes": snic_read,
        "snic_read_max_over_avg": snic_max_over_avg(snic_read) if sum(snic_read.values()) else None,
        "attention_max_over_avg": sum(ratios) / len(ratios) if ratios else None,
        "attention_busy_max_over_avg": sum(busy) / len(busy) if busy else None,
        "attention_max_over_avg_by_progress": by_progress(ratios, o.attention_times_s, end_s),
        "attention_busy_max_over_avg_by_progress": by_progress(busy, o.attention_busy_times_s, end_s),
        "snic_read_windows": snic_read_windows(o.snic_read_samples),
        "read_waits": read_waits(o.reader_samples),
        "de_read_fraction": _de_fraction(o),
        "sim_end_s": o.end_s,
        # An online run stopped once clearly past the TTFT SLO (sim/early_stop.py): the numbers above
        # cover it up to `sim_end_s` only, and it counts as not within the SLO.
        "stopped_early": o.stop_reason is not None,
        "stop_reason": o.stop_reason,
        "sim_wall_s": wall_s,
        "events": o.events,
        **({"link_utilisation": link_utilisation(o)} if o.topology.record else {}),
    }


LINK_BINS = 200  # the time bins of `links.csv` (`write_outputs`) and of `link_utilisation`
BUSY_FRACTION = 0.95  # a bin at >= this share of the link's capacity counts as busy


def link_utilisation(o: SimOutcome) -> dict[str, list[float]]:
    """Per link: [mean utilisation, share of the run's time bins at >= 95 % of capacity], from the same
    bins and rates as `links.csv` (`write_outputs`)."""
    step = max(o.end_s / LINK_BINS, 1e-3)
    out: dict[str, list[float]] = {}
    for name, link in sorted(o.topology_links().items()):
        record = link.utilisation_record()
        rates = [r for _, r in resample_utilisation(record, 0.0, o.end_s, step)]
        cap = link.capacity_bytes_per_s
        busy = sum(r >= BUSY_FRACTION * cap for r in rates) / len(rates)
        out[name] = [sum(rates) / len(rates) / cap, busy]
    return out


def by_progress(values: list[float], times_s: list[float], end_s: float) -> dict[str, float | None]:
    """Mean of per-step values in each stretch of the run ("0-5%": steps that started in its first 5 %
    of simulated time, ...; PROGRESS_EDGES); None for a stretch without steps."""
    sums = [0.0] * (len(PROGRESS_EDGES) - 1)
    counts = [0] * len(sums)
    for value, t in zip(values, times_s, strict=True):
        k = 0
        while k + 1 < len(sums) and t >= PROGRESS_EDGES[k + 1] * end_s:
            k += 1
        sums[k] += value
        counts[k] += 1
    labels = [f"{100 * a:g}-{100 * b:g}%" for a, b in zip(PROGRESS_EDGES, PROGRESS_EDGES[1:], strict=False)]
    return {label: (s / c if c else None) for label, s, c in zip(labels, sums, counts, strict=True)}


def snic_read_windows(samples: list[tuple[float, tuple[float, ...]]]) -> dict[str, Any] | None:
    """Fig. 13 as the paper measures it: max/avg of the bytes read per SNIC within each window.

    Windows with no read are left out. `loaded`: the windows in which the SNICs together read at least
    half of what they read in the mean window (the run's tail, with few reads left, drops out).
    Returns the window length and the distribution (mean, p50, p90, max) over all and loaded windows.
    """
    ratios, totals, lengths = [], [], []
    for (t0, b0), (t1, b1) in zip(samples, samples[1:], strict=False):
        read = [y - x for x, y in zip(b0, b1, strict=True)]
        total = sum(read)
        if total > 0:
            ratios.append(max(read) / (total / len(read)))
            totals.append(total)
            lengths.append(t1 - t0)
    if not ratios:
        return None
    mean_total = sum(totals) / len(totals)
    loaded = [r for r, total in zip(ratios, totals, strict=True) if total >= mean_total / 2]

    def dist(values: list[float]) -> dict[str, float]:
        stats = summarize_latencies(values)
        return {"windows": len(values), "mean": stats["mean"], "p50": stats["p50"], "p90": stats["p90"],
                "max": max(values)}  # fmt: skip

    return {
        "window_s_median": sorted(lengths)[len(lengths) // 2],
        "all": dist(ratios),
        "loaded": dist(loaded),
    }


def read_waits(samples: list[tuple[tuple[int, int, float], ...]]) -> dict[str, dict[str, float]] | None:
    """Per node, from the once-a-second samples of `-o` runs (None without them): `waiting_samples`, the
    samples with reads queued on the node; of those, `idle` the fraction with none in flight (its SNIC
    reads nothing while reads wait: the head waits for DRAM buffer space) and `buffer_used` the mean
    used fraction of the node's DRAM buffer."""
    if not samples:
        return None
    out: dict[str, dict[str, float]] = {}
    for node in range(len(samples[0])):
        waiting = [s[node] for s in samples if s[node][0] > 0]
        n = len(waiting)
        out[str(node)] = {
            "waiting_samples": n,
            "idle": sum(1 for _, inflight, _ in waiting if inflight == 0) / n if n else 0.0,
            "buffer_used": sum(used for _, _, used in waiting) / n if n else 0.0,
        }
    return out


def _de_fraction(o: SimOutcome) -> float | None:
    pe, de = o.log.read_tokens()
    return de / (pe + de) if pe + de else None


def write_outputs(o: SimOutcome, summary: dict[str, Any], config: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    write_records_jsonl(
        out_dir / "requests.jsonl", (to_record(rid, r) for rid, r in sorted(o.requests.items()))
    )
    step = max(o.end_s / LINK_BINS, 1e-3)
    links = {name: link for name, link in o.topology_links().items() if link.utilisation_record()}
    series = {
        name: resample_utilisation(link.utilisation_record(), 0.0, o.end_s, step)
        for name, link in sorted(links.items())
    }
    if series:
        times = [t for t, _ in next(iter(series.values()))]
        write_time_series_csv(
            out_dir / "links.csv",
            times,
            {f"{name}_bytes_per_s": [r for _, r in s] for name, s in series.items()},
        )
    _plots(o, series, out_dir)


def _plots(o: SimOutcome, series: dict[str, Any], out_dir: Path) -> None:
    from dualpath.metrics.plots import plot_time_series

    snic = {
        n: rates for n, rates in series.items() if "snic" in n and max((r for _, r in rates), default=0.0)
    }
    if snic:
        times = [t for t, _ in next(iter(snic.values()))]
        plot_time_series(
            out_dir / "snic_utilisation.png",
            times,
            {n: [r / 1e9 for _, r in rates] for n, rates in snic.items()},
            title="SNIC utilisation (GB/s)",
        )
    reqs = sorted(
        (r for r in o.requests.values() if not math.isnan(r.first_token_s)), key=lambda r: r.arrival_s
    )
    if reqs:
        plot_time_series(
            out_dir / "ttft.png",
            [r.arrival_s for r in reqs],
            {"TTFT (s)": [r.first_token_s - r.arrival_s for r in reqs]},
            title="TTFT over arrival time",
        )
    if o.queue_samples:
        t, waiting, reading = zip(*o.queue_samples, strict=True)
        plot_time_series(
            out_dir / "queues.png",
            list(t),
            {"waiting in scheduler": list(waiting), "read_q Mtokens (all nodes)": list(reading)},
            title="queues",
        )
