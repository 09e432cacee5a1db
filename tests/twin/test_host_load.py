"""The background-thread count the twin's shared-cores term takes from the host (twin/host_load.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from dualpath.twin.host_load import HostLoadSampler, descendants, procs_running, thread_states


def _task(proc: Path, pid: int, tid: int, state: str, ticks: int) -> None:
    d = proc / str(pid) / "task" / str(tid)
    d.mkdir(parents=True)
    # /proc/PID/task/TID/stat: "tid (comm) state ..." with utime, stime as fields 14, 15.
    rest = [state] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 5
    (d / "stat").write_text(f"{tid} (python3 x) " + " ".join(rest) + "\n")
    (d / "children").write_text("")


def _host(proc: Path, running: int) -> None:
    proc.mkdir(exist_ok=True)
    (proc / "stat").write_text(f"cpu  1 2 3 4\nprocs_running {running}\nprocs_blocked 0\n")


def test_procs_running_reads_proc_stat(tmp_path: Path) -> None:
    _host(tmp_path, 7)
    assert procs_running(tmp_path) == 7
    assert procs_running(tmp_path / "missing") is None


def test_thread_states_parse_state_and_cpu_ticks(tmp_path: Path) -> None:
    _task(tmp_path, 10, 10, "S", 5)
    _task(tmp_path, 10, 11, "R", 40)
    assert thread_states(10, tmp_path) == {10: ("S", 5), 11: ("R", 40)}
    assert thread_states(99, tmp_path) == {}


def test_background_excludes_each_running_engine_thread_and_the_sampler(tmp_path: Path) -> None:
    _host(tmp_path, 6)
    _task(tmp_path, 10, 10, "R", 100)  # PE main thread: ran the start-up probes, idle since
    _task(tmp_path, 10, 12, "R", 0)  # PE worker: the engine once it computes
    _task(tmp_path, 20, 20, "S", 3)  # DE: engine idle
    sampler = HostLoadSampler([10, 20], proc=tmp_path)
    # Before any thread used CPU since sampling began, the tie goes to the first thread id.
    assert sampler.sample() == 6 - 1 - 1
    # The worker has used the most CPU since then: it is the engine; the running main thread is
    # background like any other thread.
    (tmp_path / "10" / "task" / "12" / "stat").write_text(
        "12 (python3) R " + " ".join(["0"] * 10 + ["50", "0"] + ["0"] * 5)
    )
    (tmp_path / "10" / "task" / "10" / "stat").write_text(
        "10 (python3) R " + " ".join(["0"] * 10 + ["100", "0"] + ["0"] * 5)
    )
    assert sampler.sample() == 6 - 1 - 1
    (tmp_path / "10" / "task" / "12" / "stat").write_text(
        "12 (python3) S " + " ".join(["0"] * 10 + ["60", "0"] + ["0"] * 5)
    )
    assert sampler.sample() == 6 - 0 - 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")
def test_sampler_on_this_host_gives_a_mean(tmp_path: Path) -> None:
    with HostLoadSampler([], interval_s=0.005) as sampler:
        time.sleep(0.1)
    mean = sampler.mean()
    assert mean is not None and mean >= 0.0 and len(sampler.samples) >= 3
    assert descendants(10**9) == []
