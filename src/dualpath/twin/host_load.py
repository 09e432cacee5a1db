"""How many runnable threads of *other* jobs share the host's cores while a runtime cluster runs (Linux /proc).

The twin's shared-cores term (`physics.TwinSimulation.cpu_share`) counts the engines that compute and the
CPU work of our own other processes (the scheduler/API, the load generator, the nodes' I/O threads), both
predicted from calibrated costs. What it cannot predict is the rest of the machine: other jobs on the
same cores. `HostLoadSampler` counts exactly those: every `interval_s` it reads `procs_running` from
/proc/stat (runnable tasks on the host) and subtracts every running thread of our own process tree (the
process that samples, i.e. `dualpath validate`, and all its descendants: the `serve` child, its node
processes; the sampler thread included). The mean is the twin's `external_threads`, a condition of the
machine like its core count (docs/twin.md "Other jobs on the host").
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

_PROC = Path("/proc")
# 20 ms: short beside a forward (tens of ms here), and at ~0.1 ms per sample it costs < 1 % of a core.
DEFAULT_INTERVAL_S = 0.02


def procs_running(proc: Path = _PROC) -> int | None:
    """Runnable tasks on the host now (the reader included), or None where /proc/stat lacks the line."""
    with contextlib.suppress(OSError):
        for line in (proc / "stat").read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    return None


def thread_states(pid: int, proc: Path = _PROC) -> dict[int, tuple[str, int]]:
    """Per thread of process `pid`: (state letter, CPU ticks so far); empty once it is gone."""
    out = {}
    with contextlib.suppress(OSError):
        for task in (proc / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (task / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                out[int(task.name)] = (fields[0], int(fields[11]) + int(fields[12]))  # state, utime + stime
    return out


def descendants(pid: int, proc: Path = _PROC) -> list[int]:
    """`pid`'s child processes, recursively (Linux /proc/PID/task/TID/children)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in sorted((proc / str(pid) / "task").iterdir()):
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    out += [int(child), *descendants(int(child), proc)]
    return out


def node_pids(server_pid: int, proc: Path = _PROC) -> list[int]:
    """The node processes (`dualpath.runtime.node_main`) a local `dualpath serve` started."""
    pids = []
    for pid in descendants(server_pid, proc):
        with contextlib.suppress(OSError):
            if b"dualpath.runtime.node_main" in (proc / str(pid) / "cmdline").read_bytes():
                pids.append(pid)
    return pids


class HostLoadSampler:
    """A daemon thread sampling the runnable threads outside our own process tree; a context manager.

    `root_pid` (default: this process) and its descendants are ours: the system being predicted. Their
    threads are never counted, whether they compute or wait; everything else runnable is another job.
    """

    def __init__(
        self,
        root_pid: int | None = None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        proc: Path = _PROC,
        extra_pids: Iterable[int] = (),
    ) -> None:
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.extra_pids = tuple(extra_pids)
        self.interval_s, self.proc = interval_s, proc
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-load", daemon=True)

    def own_running(self) -> int:
        """Running threads of our own process tree now (the sampler, reading, among them)."""
        pids = {self.root_pid, *self.extra_pids, *descendants(self.root_pid, self.proc)}
        return sum(
            state == "R" for pid in sorted(pids) for state, _ in thread_states(pid, self.proc).values()
        )

    def sample(self) -> int | None:
        total = procs_running(self.proc)
        if total is None:
            return None
        # The sampler is running while it reads: if /proc shows it as such it is in own_running;
        # at least it is always one of ours.
        return max(0, total - max(1, self.own_running()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self.sample()
            if value is not None:
                self.samples.append(value)

    def mean(self) -> float | None:
        """Mean runnable threads of other jobs, or None where nothing could be sampled (no /proc)."""
        return sum(self.samples) / len(self.samples) if self.samples else None

    def __enter__(self) -> HostLoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
