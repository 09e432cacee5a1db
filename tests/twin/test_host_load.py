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


def test_external_threads_exclude_every_running_thread_of_our_own_process_tree(tmp_path: Path) -> None:
    _host(tmp_path, 6)
    _task(tmp_path, 10, 10, "R", 100)  # validate: the sampler thread, reading
    _task(tmp_path, 10, 11, "S", 5)  # validate: the load generator, waiting
    _task(tmp_path, 20, 20, "R", 0)  # its serve child: scheduler running
    _task(tmp_path, 30, 31, "R", 50)  # a node of serve: its engine computing
    _task(tmp_path, 40, 40, "R", 9)  # another job on the host
    (tmp_path / "10" / "task" / "10" / "children").write_text("20")
    (tmp_path / "20" / "task" / "20" / "children").write_text("30")
    sampler = HostLoadSampler(10, proc=tmp_path)
    assert sampler.own_running() == 3
    assert sampler.sample() == 6 - 3  # the other job and two more runnable tasks outside our tree
    (tmp_path / "30" / "task" / "31" / "stat").write_text(
        "31 (python3) S " + " ".join(["0"] * 10 + ["60", "0"] + ["0"] * 5)
    )
    _host(tmp_path, 5)
    assert sampler.sample() == 5 - 2
    _host(tmp_path, 0)  # the sampler is always one of ours, even where /proc shows nothing running
    assert sampler.sample() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")
def test_sampler_on_this_host_gives_a_mean(tmp_path: Path) -> None:
    with HostLoadSampler(interval_s=0.005) as sampler:
        time.sleep(0.1)
    mean = sampler.mean()
    assert mean is not None and mean >= 0.0 and len(sampler.samples) >= 3
    assert descendants(10**9) == []
