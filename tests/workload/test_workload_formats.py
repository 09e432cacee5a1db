import json
from pathlib import Path

import pytest

from dualpath.workload.datasets import load_dataset, load_trace
from dualpath.workload.errors import TraceFormatError
from dualpath.workload.jsonl import read_trajectories, write_trajectories
from dualpath.workload.mooncake import read_mooncake
from dualpath.workload.shipped import shipped_trace
from dualpath.workload.trajectory import Round, Trajectory


def make_trajectories() -> tuple[Trajectory, ...]:
    return (
        Trajectory(trajectory_id=0, rounds=(Round(append_tokens=900, generated_tokens=12, tool_time_s=0.5),)),
        Trajectory(
            trajectory_id=1,
            rounds=(Round(append_tokens=7, generated_tokens=1), Round(append_tokens=30, generated_tokens=4)),
            first_round_synthetic=True,
        ),
    )


def mooncake_line(timestamp: float, n_in: int, ids: list[int], n_out: int = 5) -> str:
    return json.dumps({"timestamp": timestamp, "input_length": n_in, "output_length": n_out, "hash_ids": ids})


def test_trajectory_file_round_trips(tmp_path: Path) -> None:
    path = write_trajectories(tmp_path / "t.jsonl", make_trajectories(), {"dataset": "test"})
    loaded = read_trajectories(path)
    assert loaded.trajectories == make_trajectories()
    assert loaded.metadata == {"dataset": "test"}
    assert load_dataset(path) == make_trajectories()
    assert load_trace(path).kind == "trajectories"


def test_bad_trajectory_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_trajectories(tmp_path / "t.jsonl", make_trajectories())
    lines = path.read_text().splitlines()
    lines.insert(2, '{"trajectory_id": 5, "rounds": [[10, 0, 0.0]]}')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=rf"^{path}:3: round 0: generated_tokens"):
        read_trajectories(path)
    skipped = read_trajectories(path, skip_bad=True)
    assert skipped.skipped_lines == 1 and len(skipped.trajectories) == 2


def test_missing_header_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"trajectory_id": 0, "rounds": [[1, 1]]}\n')
    with pytest.raises(TraceFormatError, match=rf"^{path}:1: unknown trace format"):
        load_trace(path)


def test_mooncake_sessions_and_hits(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        "\n".join(
            [
                mooncake_line(0, 1500, [0, 1, 2]),  # new conversation: system block 0 + its own blocks
                mooncake_line(1000, 1200, [0, 3, 4]),  # shares only the system block: new session
                mooncake_line(2000, 2100, [0, 1, 5, 6, 7]),  # extends request 0's full blocks [0, 1]
                mooncake_line(3000, 300, [0]),  # only the system block again: new session
            ]
        )
        + "\n"
    )
    requests = load_trace(path).request_trace.requests
    assert [r.session_id for r in requests] == [0, 1, 0, 2]
    assert [r.hit_tokens for r in requests] == [0, 512, 1024, 300]
    assert [r.timestamp_s for r in requests] == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (mooncake_line(0, 1500, [0, 1]), r"hash_ids has 2 ids, expected ceil\(1500/512\) = 3"),
        ('{"timestamp": 0, "input_length": 10}', "missing key 'output_length'"),
        ("not json", "not JSON"),
        (mooncake_line(-1, 10, [0]), "timestamp must be"),
    ],
)
def test_bad_mooncake_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(mooncake_line(0, 10, [9]) + "\n" + line + "\n")
    with pytest.raises(TraceFormatError, match=rf"^{path}:2: {message}"):
        read_mooncake(path)
    assert read_mooncake(path, skip_bad=True).skipped_lines == 1


def test_mooncake_conversation_trace_counts() -> None:
    trace = load_trace(shipped_trace("mooncake-conversation")).request_trace
    assert len(trace.requests) == 12_031
    mean_input = sum(r.input_tokens for r in trace.requests) / len(trace.requests)
    assert round(mean_input) == 12_035
    assert 1 < trace.num_sessions < len(trace.requests)


def test_load_dataset_by_name_is_seeded() -> None:
    assert load_dataset("32K", seed=4) == load_dataset("32k", seed=4)
    assert len(load_dataset("32k", seed=4)) == 500
