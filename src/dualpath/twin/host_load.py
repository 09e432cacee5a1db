"""The host's conditions while a runtime cluster ran: how much of its cores *other* jobs used (Linux
/proc), and how fast the cores ran (a speed probe).

`HostLoadSampler` sums the CPU ticks (utime + stime, all threads) that every process outside our own
process tree (the sampling `dualpath validate` and its descendants) consumed per `interval_s`; CPU used ÷
wall is `external_cores`, which the twin removes from the host's capacity (`sim.host`). Consumed CPU and
not a runnable-thread count: with autogroup one busy thread of another session takes up to a whole core
and a niced group almost nothing (docs/twin.md "Other jobs on the host" has the measurements).
Each sample also times a speed probe: a virtual machine's cores change speed with the load of the
machine under them (docs/twin.md "The host's speed").
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

_PROC = Path("/proc")
# 100 ms: a few samples per second catch short-lived jobs; at ~0.3 ms each the sampler costs < 1 % of a core.
DEFAULT_INTERVAL_S = 0.1
# ≈ 0.5–1 ms of one core here: < 1 % of a core at one probe per sample.
PROBE_ITERATIONS = 20_000


def speed_probe_cpu_s(iterations: int = PROBE_ITERATIONS) -> float:
    """This thread's CPU seconds (waiting for a core is not in it) for an interpreted loop: more when the
    cores run slower. Python, not a torch kernel: it tracked oracle replays' JCT better (docs/twin.md)."""
    start = time.thread_time()
    total = 0
    for i in range(iterations):
        total += i
    return time.thread_time() - start


def clock_ticks_per_s() -> float:
    """The kernel's USER_HZ, the unit of the CPU times in /proc/PID/stat (100 on Linux)."""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return float(os.sysconf("SC_CLK_TCK"))
    return 100.0


def parse_stat(stat: str) -> tuple[str, int]:
    """A /proc/PID/stat or /proc/PID/task/TID/stat line: (comm, utime + stime clock ticks).

    comm may hold spaces and parentheses, so the fields are counted after its last ")".
    """
    fields = stat[stat.rindex(")") + 2 :].split()
    return stat[stat.index("(") + 1 : stat.rindex(")")], int(fields[11]) + int(fields[12])  # proc(5) 14, 15


def process_cpu_ticks(pid: int, proc: Path = _PROC) -> int | None:
    """utime + stime of process `pid` over all its threads so far (clock ticks), or None once it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return parse_stat((proc / str(pid) / "stat").read_text())[1]
    return None


def all_pids(proc: Path = _PROC) -> list[int]:
    with contextlib.suppress(OSError):
        return sorted(int(entry.name) for entry in os.scandir(proc) if entry.name.isdigit())
    return []


def descendants(pid: int, proc: Path = _PROC) -> list[int]:
    """`pid`'s child processes, recursively (Linux /proc/PID/task/TID/children)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in sorted((proc / str(pid) / "task").iterdir()):
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    out += [int(child), *descendants(int(child), proc)]
    return out


class HostLoadSampler:
    """A daemon thread summing the CPU that processes outside our own process tree consume; a context
    manager. `root_pid` (default: this process) and its descendants are ours: the system being predicted.

    A process first seen after the start counts from zero ticks (it started during the window, or its
    earlier CPU is charged to the window: an over-count only for a process older than the window that
    our first scan missed, i.e. none). A process that starts and exits between two samples is missed.
    """

    def __init__(self, root_pid: int | None = None, *, interval_s: float = DEFAULT_INTERVAL_S,
                 proc: Path = _PROC, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.interval_s, self.proc, self.clock = interval_s, proc, clock
        self.ticks_per_s = clock_ticks_per_s()
        self.external_ticks = 0  # consumed by other jobs since the first sample
        self.probe_cpu_s_total, self.probes = 0.0, 0  # the speed probe's CPU seconds, its count
        self._last: dict[int, int] = {}  # pid -> ticks at its previous sample
        self._start_s: float | None = None
        self._end_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-load", daemon=True)

    def ours(self) -> set[int]:
        return {self.root_pid, *descendants(self.root_pid, self.proc)}

    def sample(self) -> None:
        """Add what every other process consumed since its previous sample."""
        now = self.clock()
        ours, first = self.ours(), self._start_s is None
        seen: dict[int, int] = {}
        for pid in all_pids(self.proc):
            if pid in ours:
                continue
            ticks = process_cpu_ticks(pid, self.proc)
            if ticks is None:
                continue
            seen[pid] = ticks
            if not first:
                self.external_ticks += max(0, ticks - self._last.get(pid, 0))
        self._last = seen
        self.probe_cpu_s_total += speed_probe_cpu_s()
        self.probes += 1
        if first:
            self._start_s = now
        self._end_s = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def cores(self) -> float | None:
        """Mean cores other jobs used between the first and the last sample, or None where fewer than two
        samples (or no /proc) give no interval."""
        if self._start_s is None or self._end_s is None or self._end_s <= self._start_s:
            return None
        return self.external_ticks / self.ticks_per_s / (self._end_s - self._start_s)

    def probe_cpu_s(self) -> float | None:
        """The speed probe's mean CPU seconds over the samples (None before the first)."""
        return self.probe_cpu_s_total / self.probes if self.probes else None

    def __enter__(self) -> HostLoadSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
