"""Summaries of a run: latency percentiles, SLO attainment, JCT, SNIC balance (paper §7.2 metrics).

Pure functions of records; no clock reads, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dualpath.metrics.records import RequestRecord

# Paper §7.2: online SLO is TTFT <= 4 s and TPOT <= 50 ms.
DEFAULT_TTFT_SLO_S = 4.0
DEFAULT_TPOT_SLO_S = 0.050
PERCENTILES = {"p50": 50, "p90": 90, "p99": 99}


def summarize_latencies(values: Iterable[float | None]) -> dict[str, float]:
    """mean / p50 / p90 / p99 of the known values (``None`` dropped); NaN everywhere when none are known.
    Percentiles use numpy's default (linear interpolation)."""
    return summarize_array(np.array([v for v in values if v is not None], dtype=float))


def summarize_array(array: np.ndarray) -> dict[str, float]:
    """`summarize_latencies` of a float array of known values (the same numbers for the same values)."""
    if array.size == 0:
        return {"mean": math.nan, **{name: math.nan for name in PERCENTILES}}
    points = np.percentile(array, list(PERCENTILES.values()))
    return {"mean": float(array.mean()), **{n: float(p) for n, p in zip(PERCENTILES, points, strict=True)}}


def meets_slo(record: RequestRecord, ttft_s: float, tpot_s: float) -> bool:
    """An unfinished request misses; a one-token request has no TPOT and is judged on TTFT alone."""
    if not record.finished or record.ttft_s is None:
        return False
    tpot = record.tpot_s
    return record.ttft_s <= ttft_s and (tpot is None or tpot <= tpot_s)


def slo_attainment(
    records: Sequence[RequestRecord], ttft_s: float = DEFAULT_TTFT_SLO_S, tpot_s: float = DEFAULT_TPOT_SLO_S
) -> float:
    if not records:
        return math.nan
    return sum(meets_slo(r, ttft_s, tpot_s) for r in records) / len(records)


def trajectory_jct_s(records: Iterable[RequestRecord]) -> dict[int, float]:
    """Per trajectory: its last token minus its first arrival. Trajectories with an unfinished request
    are left out (their JCT is unknown)."""
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    unfinished: set[int] = set()
    for r in records:
        if r.trajectory_id is None:
            continue
        tid = r.trajectory_id
        start[tid] = min(start.get(tid, math.inf), r.arrival_s)
        if r.last_token_s is None:
            unfinished.add(tid)
        else:
            end[tid] = max(end.get(tid, -math.inf), r.last_token_s)
    return {t: end[t] - start[t] for t in sorted(end) if t not in unfinished}


def offline_jct_s(records: Sequence[RequestRecord]) -> float:
    """Offline JCT (paper §7.2, all agents start at once): when the last trajectory finishes, measured
    from the first arrival."""
    ends = [r.last_token_s for r in records if r.last_token_s is not None]
    if not ends:
        return math.nan
    return max(ends) - min(r.arrival_s for r in records)


def snic_max_over_avg(bytes_by_node: Mapping[Any, float]) -> float:
    """Storage-NIC load balance (paper §7.5): busiest node's bytes over the mean. 1.0 is perfect; an
    all-idle cluster counts as balanced; no nodes gives NaN."""
    values = np.array(list(bytes_by_node.values()), dtype=float)
    if values.size == 0:
        return math.nan
    mean = values.mean()
    return 1.0 if mean == 0 else float(values.max() / mean)


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """The headline numbers of one run, as one JSON-able dict via ``to_dict``."""

    jct_s: dict[str, float]
    requests: int
    finished_requests: int
    ttft_s: dict[str, float]
    ttst_s: dict[str, float]
    tpot_s: dict[str, float]
    slo_attainment: float
    throughput_tok_s: float

    @classmethod
    def from_records(
        cls,
        records: Sequence[RequestRecord],
        *,
        ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
        tpot_slo_s: float = DEFAULT_TPOT_SLO_S,
    ) -> RunSummary:
        makespan_s = offline_jct_s(records)
        generated = sum(r.generated_tokens for r in records if r.finished)
        per_trajectory = trajectory_jct_s(records)
        return cls(
            jct_s={"total": makespan_s, **summarize_latencies(per_trajectory.values())},
            requests=len(records),
            finished_requests=sum(r.finished for r in records),
            ttft_s=summarize_latencies(r.ttft_s for r in records),
            ttst_s=summarize_latencies(r.ttst_s for r in records),
            tpot_s=summarize_latencies(r.tpot_s for r in records),
            slo_attainment=slo_attainment(records, ttft_slo_s, tpot_slo_s),
            throughput_tok_s=generated / makespan_s if makespan_s > 0 else math.nan,
        )

    def to_dict(self) -> dict[str, Any]:
        """NaN (unknown) becomes ``None`` so the dict is strict JSON."""
        result: dict[str, Any] = _json_safe(
            {
                "jct_s": self.jct_s,
                "requests": self.requests,
                "finished_requests": self.finished_requests,
                "ttft_s": self.ttft_s,
                "ttst_s": self.ttst_s,
                "tpot_s": self.tpot_s,
                "slo_attainment": self.slo_attainment,
                "throughput_tok_s": self.throughput_tok_s,
            }
        )
        return result


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
