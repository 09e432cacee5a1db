"""Shipped traces by name (workload/shipped.py): the name resolves to the installed file, a path still works."""

import json
from pathlib import Path

import pytest

from dualpath.cli.main import main
from dualpath.workload.datasets import detect_format
from dualpath.workload.shipped import SHIPPED_TRACES, resolve_trace, shipped_trace


def test_every_shipped_trace_is_installed_and_readable() -> None:
    for name in SHIPPED_TRACES:
        path = shipped_trace(name)
        assert path.is_file()
        assert detect_format(path) == "mooncake"


def test_name_wins_over_a_file_and_a_path_is_looked_up_in_the_folders_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mooncake-conversation").write_text("a local file of that name\n")
    assert resolve_trace("mooncake-conversation") == shipped_trace("mooncake-conversation")
    spec_folder = tmp_path / "specs"
    spec_folder.mkdir()
    (spec_folder / "t.jsonl").write_text("{}\n")
    (tmp_path / "t.jsonl").write_text("{}\n")
    assert resolve_trace("t.jsonl", folders=(spec_folder,)) == spec_folder / "t.jsonl"
    assert resolve_trace("t.jsonl") == Path("t.jsonl")


def test_unknown_name_says_where_it_looked_and_what_ships(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"'nope'.*mooncake-conversation.*looked at .*specs/nope"):
        resolve_trace("nope", folders=(tmp_path / "specs",))
    with pytest.raises(KeyError, match="mooncake-conversation"):
        shipped_trace("nope")


def test_trace_list_names_every_shipped_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["name"] for row in rows} == set(SHIPPED_TRACES)
    assert all(Path(row["path"]).is_file() for row in rows)
    assert main(["trace", "list"]) == 0
    assert "mooncake-conversation" in capsys.readouterr().out


def test_trace_stats_of_an_unknown_name_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", "no-such-trace"]) != 0
    assert "no-such-trace" in capsys.readouterr().err
