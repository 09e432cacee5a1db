"""`dualpath bench`: build agent plans from a dataset, replay them against a server, summarise.

Long contexts are scaled down for the tiny model: every append and generated count is multiplied by
`context_scale` (default 1/32, so the 64K dataset's ≈33K-token contexts become ≈1K tokens) and rounded, min
1 token. `max_rounds` keeps each trajectory's first rounds only, so a replay fits in minutes on a laptop.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import numpy as np

from dualpath.runtime.launcher import wait_healthy
from dualpath.runtime.loadgen import (
    AgentPlan,
    BenchResult,
    RoundRecord,
    poisson_starts,
    run_bench,
    scale_tokens,
    summarise,
)
from dualpath.runtime.prom import parse_snic

DEFAULT_CONTEXT_SCALE = 1 / 32  # 64K-dataset contexts (≈33K tokens, paper Table 2) -> ≈1K for tiny-llama
SNIC_SAMPLE_S = 0.5  # how often `run` reads the SNIC counters while the replay runs (`read_timeline`)


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    dataset: str = "64k"
    agents: int = 8
    aps: float | None = None  # None: offline (all agents at once)
    context_scale: float = DEFAULT_CONTEXT_SCALE
    max_rounds: int | None = None
    seed: int = 0
    endpoint: str = "completions"  # or "chat": messages through the served model's chat template


def load_trajectories(dataset: str, agents: int, seed: int) -> tuple:
    """Trajectories for `agents` agents (A.3 replay) from a Table 2 profile name or a trajectory file."""
    from dualpath.workload import load_dataset, replay_trajectories

    return replay_trajectories(load_dataset(dataset, seed=seed), agents, np.random.default_rng(seed))


def make_plans(options: BenchOptions) -> list[AgentPlan]:
    trajectories = load_trajectories(options.dataset, options.agents, options.seed)
    starts = poisson_starts(len(trajectories), options.aps, np.random.default_rng([options.seed, 1]))
    plans = []
    for agent, (trajectory, start) in enumerate(zip(trajectories, starts, strict=True)):
        rounds = trajectory.rounds[: options.max_rounds] if options.max_rounds else trajectory.rounds
        scaled = tuple(
            (
                scale_tokens(r.append_tokens, options.context_scale),
                scale_tokens(r.generated_tokens, options.context_scale),
            )
            for r in rounds
        )
        plans.append(AgentPlan(agent_id=agent, rounds=scaled, start_s=start))
    return plans


def served_model(url: str) -> str | None:
    """The id GET /v1/models names (sent as `model`, which other OpenAI servers require); None if absent."""
    response = httpx.get(f"{url}/v1/models", timeout=10)
    if response.status_code != 200:
        return None
    models = response.json().get("data") or [{}]
    return models[0].get("id")


def snic_counters(url: str) -> dict[str, dict[str, float]]:
    return parse_snic(httpx.get(f"{url}/metrics", timeout=10).text)


def snic_summary(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float | None]]:
    """Per node over the run: bytes read/written and the SNIC's utilisation while reads were waiting.

    utilisation = bytes read / (emulated rate x seconds with a read queued or in flight) — "busy while
    requests wait for reads" (brief §7); None when the node never had a read waiting.
    """
    out: dict[str, dict[str, float | None]] = {}
    for node, a in after.items():
        b = before.get(node, {})
        rx = a.get("rx", 0.0) - b.get("rx", 0.0)
        wait_s = a.get("read_wait_s", 0.0) - b.get("read_wait_s", 0.0)
        rate = a.get("rate_bytes_per_s", 0.0)
        util = rx / (rate * wait_s) if rate > 0 and wait_s > 0 else None
        out[node] = {
            "rx": rx,
            "tx": a.get("tx", 0.0) - b.get("tx", 0.0),
            "read_wait_s": wait_s,
            "utilisation": util,
        }
    return out


def run(url: str, options: BenchOptions, *, progress: bool = True) -> tuple[dict[str, object], BenchResult]:
    """Replay and summarise; SNIC bytes per node are the /metrics difference over the run."""
    plans = make_plans(options)
    httpx.get(f"{url}/health", timeout=10)  # nobody there: fail now (httpx.ConnectError), not after a wait
    health = wait_healthy(url, timeout_s=120.0)  # a server that is still starting gets time to come up
    before = snic_counters(url)
    vocab_size = int(health.get("vocab_size", 256))
    model = served_model(url)
    sampler = SnicSampler(lambda: snic_counters(url), every_s=SNIC_SAMPLE_S)
    sampler.start()
    try:
        result = asyncio.run(
            run_bench(
                url,
                plans,
                vocab_size=vocab_size,
                seed=options.seed,
                progress=progress,
                endpoint=options.endpoint,
                model=model,
            )
        )
    finally:
        sampler.stop()
    time.sleep(0.15)  # three node report intervals (50 ms), so /metrics holds the run's last bytes
    summary = summarise(result)
    summary["snic"] = snic_summary(before, snic_counters(url))
    summary["read_timeline"] = read_timeline(sampler.samples)
    summary["mode"] = health.get("mode")
    summary["endpoint"] = options.endpoint
    # β and the §6.4 predictor as this run's PEs measured them at start-up: the run's scheduler constants.
    summary["scheduler_rates"] = {
        k: float(health[k]) for k in ("prefill_tokens_per_s", "attention_s_per_token_pair") if k in health
    }
    summary["read_sides"] = _count_sides(result)
    summary["milestones_mean_s"] = _mean_milestones(result.rounds)
    summary["rounds"] = rounds_breakdown(result)
    return summary, result


class SnicSampler:
    """Reads the SNIC counters (`read_counters`, e.g. /metrics through `snic_counters`) every `every_s`
    on a thread of its own while a replay runs; `samples` holds (seconds since `start`, counters), each
    stamped halfway through its read (a /metrics call on a busy host takes tens of ms)."""

    def __init__(self, read_counters: Callable[[], dict[str, dict[str, float]]], *, every_s: float) -> None:
        self._read, self._every_s = read_counters, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="snic-sampler", daemon=True)
        self._started_s = 0.0
        self.samples: list[tuple[float, dict[str, dict[str, float]]]] = []

    def start(self) -> None:
        self._started_s = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Takes one last sample (the run's end) and joins the thread."""
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        due_s = self._started_s
        while True:
            self._sample()
            due_s += self._every_s  # on a fixed grid: a slow read does not push the later ones back
            if self._stop.wait(max(0.0, due_s - time.monotonic())):
                return

    def _sample(self) -> None:
        asked_s = time.monotonic()
        try:
            counters = self._read()
        except (httpx.HTTPError, ValueError):  # a server gone, or a page cut short: one sample fewer
            return
        self.samples.append(((asked_s + time.monotonic()) / 2 - self._started_s, counters))


def read_timeline(samples: Sequence[tuple[float, dict[str, dict[str, float]]]]) -> dict[str, object]:
    """Each node's SNIC read rate between consecutive samples: `t_s` (each interval's end, seconds since
    the replay started, to a few ms of the load generator's clock) and `read_mb_per_s` per node. The
    counters move with the nodes' reports (every 50 ms), so an interval holds its own bytes give or take
    one report's worth at each end: about a tenth of a 0.5 s interval's."""
    ends: list[float] = []
    rates: dict[str, list[float]] = {node: [] for node in samples[-1][1]} if samples else {}
    for (t0, before), (t1, after) in itertools.pairwise(samples):
        if t1 <= t0:
            continue
        ends.append(t1)
        for node, series in rates.items():
            moved = after.get(node, {}).get("rx", 0.0) - before.get(node, {}).get("rx", 0.0)
            series.append(moved / (t1 - t0) / 1e6)
    return {"t_s": ends, "read_mb_per_s": rates}


def rounds_breakdown(result: BenchResult) -> list[dict[str, object]]:
    """Per round index (0: each agent's first round, which reads nothing from an empty store): how many
    requests, when they were sent (mean seconds since the bench started), their mean latency to the last
    token, the mean seconds from arrival to each server-side milestone, and the mean wait from the last
    token to `finished` (the round's blocks persisted: the stream ends then, and the agent's next round is
    sent)."""
    by_round: dict[int, list[RoundRecord]] = {}
    for record in result.rounds:
        by_round.setdefault(record.round_index, []).append(record)
    return [
        {
            "round": index,
            "requests": len(records),
            "sent_mean_s": _mean([r.sent_s for r in records]),
            "latency_mean_s": _mean([r.done_s - r.sent_s for r in records]),
            "finished_after_last_token_mean_s": _mean(
                [w for r in records if (w := _wait_after_last_token(r)) is not None]
            ),
            "milestones_mean_s": _mean_milestones(records),
        }
        for index, records in sorted(by_round.items())
    ]


def _wait_after_last_token(record: RoundRecord) -> float | None:
    """Server-side seconds from the request's last token (token 1 at the prefill's end when it had no
    decode) to `finished`; None without those times."""
    times = _times(record)
    last = times.get("last_token", times.get("prefill_end"))
    return None if last is None or "finished" not in times else float(times["finished"]) - float(last)


def _times(record: RoundRecord) -> dict[str, float]:
    return dict(record.info.get("times_s", {}))  # type: ignore[call-overload]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _mean_milestones(records: Sequence[RoundRecord]) -> dict[str, float]:
    """Mean seconds from arrival to each server-side milestone (read end, prefill start, ...)."""
    values: dict[str, list[float]] = {}
    for record in records:
        for key, value in _times(record).items():
            values.setdefault(key, []).append(float(value))
    means = {key: _mean(v) for key, v in values.items()}
    return dict(sorted(means.items(), key=lambda kv: kv[1]))  # in the order a request reaches them


def _count_sides(result: BenchResult) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in result.rounds:
        side = str(record.info.get("read_side", "none"))
        counts[side] = counts.get(side, 0) + 1
    return dict(sorted(counts.items()))


def format_summary(summary: dict) -> str:
    lines = [
        f"mode {summary.get('mode')} ({summary.get('endpoint', 'completions')}): {summary['agents']} agents, {summary['requests']} requests in {summary['wall_s']:.2f} s",
        f"  JCT (all agents) {summary['jct_s']:.2f} s   agent JCT p50 {summary['agent_jct_s']['p50']:.2f} s",
        f"  tokens/s {summary['tokens_per_s']:.1f}   read sides {summary['read_sides']}",
    ]
    for name in ("ttft_s", "ttst_s", "tpot_s"):
        p = summary[name]
        lines.append(
            f"  {name[:-2].upper():5s} mean {p['mean'] * 1e3:8.1f} ms  p50 {p['p50'] * 1e3:8.1f}  p90 {p['p90'] * 1e3:8.1f}  p99 {p['p99'] * 1e3:8.1f}"
        )
    for node, d in summary["snic"].items():
        util = "   -" if d["utilisation"] is None else f"{100 * d['utilisation']:3.0f}%"
        lines.append(
            f"  SNIC {node}: read {d['rx'] / 1e6:8.2f} MB   written {d['tx'] / 1e6:8.2f} MB   busy while reads wait {util}"
        )
    return "\n".join(lines)
