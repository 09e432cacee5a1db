"""A run in which no decode engine could ever hold a round is refused up front, not left to stall."""

from __future__ import annotations

import json

import pytest

from dualpath.cli.main import main


def test_simulate_refuses_rounds_longer_than_a_decode_engine_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Qwen2.5-32B in BF16 leaves ~25K KV tokens per 80 GB GPU; 64K trajectories reach 65,536 tokens.
    argv = ["simulate", "--hardware", "hopper-8x400g", "--model", "qwen2.5-32b", "--p", "1", "--d", "2",
            "--dataset", "64k", "--agents", "4", "--mode", "dualpath", "--quiet", "--json"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds at most" in err and "qwen2.5-32b" in err


def test_simulate_runs_when_every_round_fits(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--hardware", "hopper-8x400g", "--model", "ds-27b", "--p", "1", "--d", "1",
            "--dataset", "32k", "--agents", "2", "--mode", "dualpath", "--quiet", "--json"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["agents_finished"] == 2
