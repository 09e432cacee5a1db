"""The other jobs' CPU the twin's shared-cores term takes from the host (twin/host_load.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from dualpath.twin.host_load import (
    HostLoadSampler,
    all_pids,
    descendants,
    process_cpu_ticks,
)


def _process(proc: Path, pid: int, ticks: int, children: str = "") -> None:
    """/proc/PID/stat: "pid (comm) state ..." with utime, stime as fields 14, 15; one task with children."""
    d = proc / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    rest = ["R"] + ["0"] * 10 + [str(ticks - ticks // 3), str(ticks // 3)] + ["0"] * 5
    (d / "stat").write_text(f"{pid} (python3 x) " + " ".join(rest) + "\n")
    (d / "task" / str(pid) / "children").write_text(children)


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_process_cpu_ticks_read_utime_plus_stime(tmp_path: Path) -> None:
    _process(tmp_path, 10, 45)
    assert process_cpu_ticks(10, tmp_path) == 45
    assert process_cpu_ticks(99, tmp_path) is None
    assert all_pids(tmp_path) == [10]


def test_other_jobs_cores_count_what_processes_outside_our_tree_consumed(tmp_path: Path) -> None:
    _process(tmp_path, 10, 100, children="20")  # validate: load generator + this sampler
    _process(tmp_path, 20, 50, children="30")  # its serve child
    _process(tmp_path, 30, 500)  # a node of serve: its engine computing
    _process(tmp_path, 40, 7)  # another job on the host
    clock = _Clock()
    sampler = HostLoadSampler(10, proc=tmp_path, clock=clock)
    sampler.ticks_per_s = 100.0
    assert sampler.ours() == {10, 20, 30}
    sampler.sample()
    assert sampler.cores() is None  # one sample: no interval yet
    clock.now_s = 2.0
    _process(tmp_path, 30, 900)  # ours: never counted, however busy
    _process(tmp_path, 40, 107)  # the other job used 1 s of CPU
    _process(tmp_path, 50, 60)  # a job started meanwhile: all its CPU is in the window
    sampler.sample()
    assert sampler.cores() == pytest.approx((100 + 60) / 100 / 2.0)
    clock.now_s = 4.0
    (tmp_path / "40" / "stat").unlink()  # exited: what it used before stays counted
    sampler.sample()
    assert sampler.cores() == pytest.approx(1.6 / 4.0)
    assert descendants(10, tmp_path) == [20, 30]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")
def test_sampler_on_this_host_measures_a_busy_process_outside_our_tree() -> None:
    import subprocess

    # Started by a shell that exits at once: the spinning grandchild is not our descendant.
    spin = "import time; end = time.time() + 5\nwhile time.time() < end: pass"
    pid = int(
        subprocess.run(
            ["sh", "-c", f'"{sys.executable}" -c "{spin}" >/dev/null 2>&1 & echo $!'],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    try:
        with HostLoadSampler(interval_s=0.05) as sampler:
            time.sleep(0.6)
    finally:
        subprocess.run(["kill", str(pid)], check=False)
    cores = sampler.cores()
    assert cores is not None and cores > 0.3  # one spinning process: most of a core
    assert descendants(10**9) == []


def test_each_sample_times_the_speed_probe(tmp_path: Path) -> None:
    _process(tmp_path, 10, 100)
    sampler = HostLoadSampler(10, proc=tmp_path, clock=_Clock())
    assert sampler.probe_cpu_s() is None
    sampler.sample()
    sampler.sample()
    assert sampler.probes == 2
    mean = sampler.probe_cpu_s()
    assert mean is not None and mean == pytest.approx(sampler.probe_cpu_s_total / 2)
    assert 0.0 < mean < 1.0
