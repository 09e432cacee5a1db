"""The DE's decode-restart counter (`/metrics`, the twin's in-situ `decode_restart_s`): the wait between a
run's end and the next run of the same batch, without the next run's own work."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from dualpath.runtime.de_executor import DecodeExecutor
from dualpath.runtime.model_host import build_model
from dualpath.runtime.spans import Spans

JOIN_COPY_S = 0.3  # an oracle joiner's inline KV copy, stood in for by a sleep


def _executor() -> tuple[DecodeExecutor, list[Any]]:
    reports: list[Any] = []
    links = SimpleNamespace(
        model=build_model("tiny-llama", device="cpu", seed=0),
        block_tokens=16,
        spec=SimpleNamespace(hbm_tokens=64),
        emit=reports.append,
        spans=Spans("d0"),  # off, as without DUALPATH_PROFILE_DIR
    )
    return DecodeExecutor(links), reports  # type: ignore[arg-type]


def _run(step: int, batch: list[int], join: list[dict[str, Any]]) -> dict[str, Any]:
    # The requests have no output budget set (max_tokens 0), so each run ends without a decode step.
    return {"type": "decode", "step": step, "steps": 1, "batch": batch, "join": join, "inline_io": True}


def test_an_oracle_joiners_inline_copy_is_not_counted_as_restart_wait() -> None:
    """The restart ends where the next run's piece begins: the joiner's copy is the piece's work
    (EngineWork times it), and the twin charges the piece's CPU and the restart wait each once."""
    executor, reports = _executor()
    try:
        executor._step(_run(1, [1], []))
        executor._join = lambda join, *, inline_io: time.sleep(JOIN_COPY_S)  # type: ignore[method-assign]
        executor._step(_run(2, [1, 2], [{"rid": 2}]))
    finally:
        executor.close()
    assert [r["step"] for r in reports] == [1, 2]
    assert executor.decode_restarts == 1  # run 2 continued request 1
    assert executor.decode_restart_s < JOIN_COPY_S / 2


def test_a_run_of_a_new_batch_is_no_restart() -> None:
    executor, _ = _executor()
    try:
        executor._step(_run(1, [1], []))
        executor._step(_run(2, [2], []))
    finally:
        executor.close()
    assert executor.decode_restarts == 0
