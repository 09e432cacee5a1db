"""Summary statistics of a trace file (the numbers ``dualpath trace stats`` prints).

Trajectory files follow the Table 2 reading (docs/workload.md): ``append_tokens`` and
``generated_tokens`` describe each trajectory's mean per round (round 0's prompt counts as its append),
``context_tokens`` pools every round of every trajectory, ``total_tokens`` is each trajectory's final
length. The pooled per-round distributions are reported too, under ``round_*`` names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dualpath.workload.mooncake import RequestTrace
from dualpath.workload.trajectory import Trajectory


def distribution(values: npt.ArrayLike) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    p50, p99 = np.percentile(array, [50, 99])
    return {"mean": float(array.mean()), "p50": float(p50), "p99": float(p99)}


def trajectory_stats(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    rounds = np.array([t.num_rounds for t in trajectories], dtype=float)
    appends = [t.append_tokens_array for t in trajectories]
    gens = [t.generated_tokens_array for t in trajectories]
    contexts = [t.context_tokens_array for t in trajectories]
    hits = sum(int(t.hit_tokens_array.sum()) for t in trajectories)
    prompt = sum(int(c.sum()) for c in contexts)
    return {
        "kind": "trajectories",
        "trajectories": len(trajectories),
        "rounds": int(rounds.sum()),
        "rounds_per_trajectory": distribution(rounds),
        "append_tokens": distribution([a.mean() for a in appends]),
        "generated_tokens": distribution([g.mean() for g in gens]),
        "context_tokens": distribution(_pooled(contexts)),
        "total_tokens": distribution([t.total_tokens for t in trajectories]),
        "first_append_tokens": distribution([a[0] for a in appends]),
        "round_append_tokens": distribution(_pooled(appends)),
        "round_generated_tokens": distribution(_pooled(gens)),
        "synthetic_first_rounds": sum(t.first_round_synthetic for t in trajectories),
        "prefix_hit_ratio": hits / prompt if prompt else 0.0,
    }


def _pooled(arrays: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def request_stats(trace: RequestTrace) -> dict[str, Any]:
    requests = trace.requests
    per_session = Counter(r.session_id for r in requests)
    inputs = sum(r.input_tokens for r in requests)
    times = [r.timestamp_s for r in requests]
    return {
        "kind": "requests",
        "requests": len(requests),
        "duration_s": (max(times) - min(times)) if times else 0.0,
        "input_tokens": distribution([r.input_tokens for r in requests]),
        "output_tokens": distribution([r.output_tokens for r in requests]),
        "sessions": len(per_session),
        "multi_turn_sessions": sum(1 for n in per_session.values() if n > 1),
        "requests_per_session": distribution(sorted(per_session.values())),
        "prefix_hit_ratio": sum(r.hit_tokens for r in requests) / inputs if inputs else 0.0,
    }


def format_table(stats: dict[str, Any]) -> str:
    """A readable table: distributions as rows of mean / p50 / p99, scalars below."""
    names = [k for k, v in stats.items() if isinstance(v, dict)]
    width = max([len(n) for n in names] + [len(k) for k in stats] + [10])
    lines = [f"{'':<{width}}  {'mean':>12}  {'p50':>12}  {'p99':>12}"]
    for name in names:
        d = stats[name]
        lines.append(f"{name:<{width}}  {d['mean']:>12,.1f}  {d['p50']:>12,.1f}  {d['p99']:>12,.1f}")
    lines.append("")
    for key, value in stats.items():
        if isinstance(value, dict):
            continue
        shown = (
            f"{value:.4f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else value
        )
        lines.append(f"{key:<{width}}  {shown}")
    return "\n".join(lines)
