"""How many threads outside the engine nodes want a core while a runtime cluster runs (Linux /proc).

The twin's shared-cores term (`physics.TwinSimulation.cpu_share`) counts the engines that compute; on a
shared host the engines also share the cores with every other runnable thread: the scheduler process,
the load generator, and other jobs. `HostLoadSampler` counts them: every `interval_s` it reads
`procs_running` from /proc/stat (runnable tasks on the host, this sampler included) and subtracts the
engine threads that are running and the sampler itself. The mean is the twin's
`background_threads` (docs/twin.md "Background threads").
"""

from __future__ import annotations

import contextlib
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
    """A daemon thread sampling the background runnable threads; use as a context manager.

    An engine is one thread of its node process (the PE's forward worker, the DE's decode loop); the
    node's other threads (receivers, the store writer, the load/send pools) are background like any
    other. The engine thread is the one that has used the most CPU since sampling began.
    """

    def __init__(
        self, engine_pids: Iterable[int], *, interval_s: float = DEFAULT_INTERVAL_S, proc: Path = _PROC
    ) -> None:
        self.engine_pids = tuple(engine_pids)
        self.interval_s, self.proc = interval_s, proc
        self.samples: list[int] = []
        self._start_ticks: dict[int, dict[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-load", daemon=True)

    def _engine_running(self, pid: int) -> bool:
        threads = thread_states(pid, self.proc)
        if not threads:
            return False
        start = self._start_ticks.setdefault(pid, {tid: ticks for tid, (_, ticks) in threads.items()})
        engine = max(threads, key=lambda tid: (threads[tid][1] - start.get(tid, 0), -tid))
        return threads[engine][0] == "R"

    def sample(self) -> int | None:
        total = procs_running(self.proc)
        if total is None:
            return None
        engines = sum(self._engine_running(pid) for pid in self.engine_pids)
        return max(0, total - engines - 1)  # - 1: this sampler, running while it reads

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            value = self.sample()
            if value is not None:
                self.samples.append(value)

    def mean(self) -> float | None:
        """Mean background runnable threads, or None where nothing could be sampled (no /proc)."""
        return sum(self.samples) / len(self.samples) if self.samples else None

    def __enter__(self) -> HostLoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
