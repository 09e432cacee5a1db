import json
from pathlib import Path

import pytest

from dualpath.cli.main import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_then_stats_64k_matches_table2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    assert (
        main(["trace", "generate", "--dataset", "64k", "--agents", "500", "--seed", "0", "-o", str(out)]) == 0
    )
    capsys.readouterr()
    stats = run_json(capsys, "trace", "stats", str(out), "--json")
    assert stats["trajectories"] == 500
    expected = {
        "rounds_per_trajectory": 157,
        "append_tokens": 429,
        "generated_tokens": 176,
        "context_tokens": 32_721,
        "total_tokens": 55_958,
    }
    for key, want in expected.items():
        assert abs(stats[key]["mean"] / want - 1) < 0.05, key
    assert 0.95 < stats["prefix_hit_ratio"] < 1.0


def test_generate_more_agents_than_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    assert (
        main(["trace", "generate", "--dataset", "32k", "--agents", "520", "--seed", "1", "-o", str(out)]) == 0
    )
    capsys.readouterr()
    stats = run_json(capsys, "trace", "stats", str(out), "--json")
    assert stats["trajectories"] == 520
    assert stats["synthetic_first_rounds"] == 20


def test_stats_table_is_readable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    main(["trace", "generate", "--dataset", "48k", "--agents", "3", "-o", str(out)])
    capsys.readouterr()
    assert main(["trace", "stats", str(out)]) == 0
    table = capsys.readouterr().out
    assert "context_tokens" in table and "mean" in table and "p99" in table


def test_stats_on_bad_file_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    assert main(["trace", "stats", str(bad)]) == 2
    assert f"{bad}:1:" in capsys.readouterr().err


def test_stats_on_mooncake_conversation_trace(capsys: pytest.CaptureFixture[str]) -> None:
    stats = run_json(capsys, "trace", "stats", "mooncake-conversation", "--json")
    assert stats["requests"] == 12_031
    assert round(stats["input_tokens"]["mean"]) == 12_035
    assert stats["sessions"] < 12_031
