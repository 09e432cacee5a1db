"""`dualpath serve` at its edges: a node that cannot start, SIGTERM with a request in flight, temporary
folders left by a killed `serve` (issue 20, rows 9, 10, 13)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from dualpath.runtime.launcher import free_port, wait_healthy
from dualpath.runtime.serve import remove_stale_run_dirs


def _serve(*args: str, port: int | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "dualpath.cli.main", "serve", "--port", str(port or free_port()), *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_a_node_that_cannot_start_says_why_in_one_line_and_exits_2(tmp_path, capsys):
    from dualpath.runtime.node_main import add_node_arguments, run_reporting_start_errors

    parser = argparse.ArgumentParser()
    add_node_arguments(parser)
    args = parser.parse_args(["--role", "decode", "--scheduler", "tcp://127.0.0.1:1", "--store",
                              str(tmp_path), "--config", str(tmp_path / "missing.toml")])  # fmt: skip
    assert run_reporting_start_errors(args) == 2
    assert capsys.readouterr().err.startswith("dualpath node decode: cannot start: no cluster file")


@pytest.mark.slow  # ~20 s: starts a cluster
def test_a_node_that_cannot_start_stops_serve_with_its_message_and_status_1():
    process = _serve("--set", "device=cuda:99")  # passes the name check; no node can build there
    try:
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 1, output
    assert "cannot start" in output and "stopping: node" in output


def _stream_forever(url: str, started: threading.Event) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": 8000, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            for _ in response.iter_bytes():
                started.set()
    except httpx.HTTPError:
        pass


def _time_to_exit_after_sigterm(grace_s: float, signals: int) -> tuple[float, int | None]:
    port = free_port()
    process = _serve("--shutdown-grace", str(grace_s), "--set", "hbm_tokens=16384", port=port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 180, process)  # type: ignore[arg-type]
        started = threading.Event()
        threading.Thread(target=_stream_forever, args=(url, started), daemon=True).start()
        assert started.wait(60)
        begin = time.monotonic()
        for _ in range(signals):
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        try:
            process.wait(grace_s + 15)
        except subprocess.TimeoutExpired:
            return float("inf"), None
        return time.monotonic() - begin, process.returncode
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow  # ~30 s: starts a cluster
def test_sigterm_waits_at_most_the_grace_period_for_a_long_stream():
    elapsed_s, status = _time_to_exit_after_sigterm(2.0, signals=1)
    assert status == 0 and elapsed_s < 2.0 + 5.0  # node stop and interpreter exit on a busy 2-core host


@pytest.mark.slow  # ~20 s: starts a cluster
def test_a_second_sigterm_stops_at_once():
    elapsed_s, status = _time_to_exit_after_sigterm(60.0, signals=2)
    assert status == 0 and elapsed_s < 10.0


def test_temporary_folders_of_a_dead_serve_are_removed_by_the_next(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = [tmp_path / f"dualpath-run-{gone.pid}-abc_12", tmp_path / f"dualpath-store-{gone.pid}-x9"]
    alive = [tmp_path / f"dualpath-run-{os.getpid()}-abc", tmp_path / "dualpath-run-old1234"]
    for folder in dead + alive:
        (folder / "sub").mkdir(parents=True)
    assert sorted(remove_stale_run_dirs(tmp_path)) == sorted(p.name for p in dead)
    assert [p.exists() for p in dead + alive] == [False, False, True, True]
