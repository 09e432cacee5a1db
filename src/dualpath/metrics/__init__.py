"""Run metrics shared by the simulator, the runtime and the load generator: records, summaries, writers.

Plot helpers live in ``dualpath.metrics.plots`` (imported on demand: matplotlib is slow to load)."""

from dualpath.metrics.records import RequestRecord
from dualpath.metrics.summary import (
    RunSummary,
    offline_jct_s,
    slo_attainment,
    snic_max_over_avg,
    summarize_latencies,
    trajectory_jct_s,
)
from dualpath.metrics.writers import read_records_jsonl, write_records_jsonl, write_time_series_csv

__all__ = [
    "RequestRecord",
    "RunSummary",
    "offline_jct_s",
    "read_records_jsonl",
    "slo_attainment",
    "snic_max_over_avg",
    "summarize_latencies",
    "trajectory_jct_s",
    "write_records_jsonl",
    "write_time_series_csv",
]
