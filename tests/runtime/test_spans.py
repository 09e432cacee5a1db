"""Per-piece timings (`runtime/spans.py`): nothing recorded unless a folder is named; spans and marks keep
their keys, wall and CPU time, and come back from the folder the processes wrote to."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dualpath.runtime.spans import PROFILE_DIR_ENV, Spans, message_keys, read_spans


def test_off_without_a_folder_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILE_DIR_ENV, raising=False)
    spans = Spans.from_env("p0")
    with spans.span("pe.forward", step_id=1):
        pass
    spans.mark("node.recv", msg="step")
    assert not spans.on and spans.records == [] and spans.dump() is None


def test_spans_and_marks_are_written_with_their_keys_wall_and_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    spans = Spans.from_env("d0")
    with spans.span("de.run", step=3, rids=[1, 2]):
        deadline = time.thread_time() + 0.02
        while time.thread_time() < deadline:  # 20 ms of this thread's CPU
            pass
        time.sleep(0.03)  # and 30 ms more of wall
    spans.mark("node.emit", **message_keys({"type": "decode_done", "step": 3, "tokens": [[1, [5]]]}))
    assert spans.dump() == tmp_path / "d0.jsonl"
    records = read_spans(tmp_path)
    run = next(r for r in records if r["piece"] == "de.run")
    assert run["process"] == "d0" and run["step"] == 3 and run["rids"] == [1, 2]
    assert run["cpu"] >= 0.02 and run["wall"] >= run["cpu"] + 0.025
    emit = next(r for r in records if r["piece"] == "node.emit")
    assert emit["msg"] == "decode_done" and emit["step"] == 3 and "tokens" not in emit
    assert emit["t"] >= run["t"] + run["wall"]  # one clock (monotonic) for both
    totals = next(r for r in records if r["piece"] == "process")
    assert totals["cpu"] >= 0.02 and "MainThread" in totals["threads"]
