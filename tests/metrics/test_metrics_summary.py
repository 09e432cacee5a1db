import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath.metrics import (
    RequestRecord,
    RunSummary,
    offline_jct_s,
    read_records_jsonl,
    slo_attainment,
    snic_max_over_avg,
    summarize_latencies,
    trajectory_jct_s,
    write_records_jsonl,
    write_time_series_csv,
)


def make_record(
    *,
    request_id: int = 0,
    trajectory_id: int = 0,
    arrival_s: float = 0.0,
    first_s: float | None = 1.0,
    second_s: float | None = 1.02,
    last_s: float | None = 2.0,
    generated: int = 51,
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        trajectory_id=trajectory_id,
        round_index=0,
        prompt_tokens=1000,
        hit_tokens=900,
        generated_tokens=generated,
        arrival_s=arrival_s,
        first_token_s=first_s,
        second_token_s=second_s,
        last_token_s=last_s,
        read_side="de",
    )


def test_derived_latencies() -> None:
    r = make_record(arrival_s=0.5, first_s=1.5, second_s=1.53, last_s=3.5, generated=101)
    assert r.ttft_s == pytest.approx(1.0)
    assert r.ttst_s == pytest.approx(0.03)
    assert r.tpot_s == pytest.approx(0.02)
    assert r.miss_tokens == 100
    assert make_record(generated=1).tpot_s is None
    assert make_record(first_s=None).ttft_s is None


def test_bad_read_side_is_rejected() -> None:
    with pytest.raises(ValueError, match="read_side"):
        replace(make_record(), read_side="both")


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=200))
def test_percentiles_match_numpy(values: list[float]) -> None:
    summary = summarize_latencies(values)
    assert summary["mean"] == pytest.approx(np.mean(values))
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert summary[name] == pytest.approx(np.percentile(values, q))


def test_summary_of_nothing_is_nan_and_none_values_are_dropped() -> None:
    assert all(math.isnan(v) for v in summarize_latencies([]).values())
    assert summarize_latencies([None, 2.0, None])["p99"] == 2.0


def test_slo_attainment_counts_both_conditions() -> None:
    records = [
        make_record(first_s=1.0, last_s=2.0, generated=51),  # ttft 1 s, tpot 20 ms: meets
        make_record(first_s=5.0, last_s=6.0, generated=51),  # ttft 5 s: misses
        make_record(first_s=1.0, last_s=5.0, generated=51),  # tpot 80 ms: misses
        make_record(first_s=1.0, last_s=1.0, generated=1),  # one token: judged on ttft, meets
        make_record(first_s=None, second_s=None, last_s=None),  # unfinished: misses
    ]
    assert slo_attainment(records) == pytest.approx(2 / 5)
    assert slo_attainment(records, ttft_s=10.0, tpot_s=1.0) == pytest.approx(4 / 5)


def test_jct_per_trajectory_and_offline() -> None:
    records = [
        make_record(request_id=0, trajectory_id=0, arrival_s=0.0, last_s=3.0),
        make_record(request_id=1, trajectory_id=0, arrival_s=3.0, first_s=4.0, last_s=9.0),
        make_record(request_id=2, trajectory_id=1, arrival_s=1.0, last_s=5.0),
        make_record(request_id=3, trajectory_id=2, arrival_s=0.0, first_s=None, second_s=None, last_s=None),
    ]
    assert trajectory_jct_s(records) == {0: 9.0, 1: 4.0}
    assert offline_jct_s(records) == 9.0


def test_snic_balance() -> None:
    assert snic_max_over_avg({"n0": 100.0, "n1": 100.0}) == 1.0
    assert snic_max_over_avg({"n0": 300.0, "n1": 100.0}) == pytest.approx(1.5)
    assert snic_max_over_avg({"n0": 0.0}) == 1.0
    assert math.isnan(snic_max_over_avg({}))


def test_run_summary_is_strict_json() -> None:
    records = [make_record(request_id=i, trajectory_id=i, arrival_s=0.0, last_s=2.0 + i) for i in range(4)]
    summary = RunSummary.from_records(records).to_dict()
    text = json.dumps(summary, allow_nan=False)
    assert set(json.loads(text)) >= {"jct_s", "requests", "ttft_s", "ttst_s", "tpot_s", "slo_attainment"}
    assert summary["jct_s"]["total"] == 5.0
    assert summary["jct_s"]["mean"] == pytest.approx(3.5)
    assert summary["throughput_tok_s"] == pytest.approx(4 * 51 / 5.0)
    assert set(summary["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    empty = RunSummary.from_records([]).to_dict()
    assert empty["ttft_s"]["p99"] is None and empty["requests"] == 0


def test_records_round_trip_jsonl(tmp_path: Path) -> None:
    records = [make_record(request_id=i) for i in range(3)]
    path = write_records_jsonl(tmp_path / "r.jsonl", records)
    assert read_records_jsonl(path) == records


def test_time_series_csv(tmp_path: Path) -> None:
    path = write_time_series_csv(tmp_path / "s.csv", [0.0, 1.0], {"snic0_bytes_per_s": [5.0, 7.5]})
    assert path.read_text().splitlines() == ["time_s,snic0_bytes_per_s", "0.0,5.0", "1.0,7.5"]
    with pytest.raises(ValueError, match="snic0"):
        write_time_series_csv(tmp_path / "x.csv", [0.0], {"snic0": [1.0, 2.0]})
