"""A Mooncake trace as a simulator workload: one agent per recovered session (experiments/traces.py)."""

from __future__ import annotations

import json
from pathlib import Path

from dualpath.experiments.sweep import parse_sweep
from dualpath.experiments.traces import as_trajectory_file
from dualpath.workload.datasets import load_dataset

MOONCAKE = [
    {"timestamp": 0, "input_length": 1024, "output_length": 100, "hash_ids": [1, 2]},
    {"timestamp": 5, "input_length": 600, "output_length": 0, "hash_ids": [9, 10]},
    {
        "timestamp": 9,
        "input_length": 1600,
        "output_length": 30,
        "hash_ids": [1, 2, 3, 4],
    },  # continues the 1st
]


def write_trace(path: Path, records: list[dict] = MOONCAKE) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_sessions_become_agents_whose_rounds_append_the_new_tokens(tmp_path: Path) -> None:
    converted = as_trajectory_file(write_trace(tmp_path / "mc.jsonl"), tmp_path / "traces")
    agents = load_dataset(str(converted))
    rounds = [[(r.append_tokens, r.generated_tokens, r.tool_time_s) for r in a.rounds] for a in agents]
    # 1600 − (1024 + 100) = 476 new tokens; an output of 0 still generates one token.
    assert rounds == [[(1024, 100, 0.0), (476, 30, 0.0)], [(600, 1, 0.0)]]
    assert as_trajectory_file(converted, tmp_path / "other") == converted  # a trajectory file stays as it is
    stamp = converted.stat().st_mtime_ns
    assert as_trajectory_file(tmp_path / "mc.jsonl", tmp_path / "traces") == converted  # converted once
    assert converted.stat().st_mtime_ns == stamp


def test_a_changed_trace_gets_a_new_file_and_new_run_keys(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "mc.jsonl")
    raw = {"base": {"model": "ds-27b", "layout": "1P1D", "mode": "basic", "trace": "mc.jsonl"}}

    def key() -> str:
        return parse_sweep(raw, where="t", folder=tmp_path, trace_dir=tmp_path / "traces").runs[0].spec.key()

    first = key()
    write_trace(trace, [{**MOONCAKE[0], "output_length": 101}, *MOONCAKE[1:]])
    assert key() != first
