"""The host's cores as a processor-sharing server: our threads' CPU work, work-conserving (docs/twin.md).

Each of our runtime's threads that computes (a PE's forward worker, a DE's decode loop, the scheduler's
event loop, the load generator, a node's I/O threads) is a *thread* here with a FIFO of CPU work; only
its head item runs (a thread does one thing at a time). An item has a *weight* w ≤ 1: the share of a
thread's time it keeps busy (1 for a thread that computes without pause; a node's I/O work, spread over
its engine's forward or decode run, runs at its fraction of the engine's pace). The host gives a running
item the rate speed · w · min(1, capacity / W), W = the sum of the running items' weights and a constant
background (our threads that work all the time: reports, polls), capacity = the host's cores less what
other jobs took, speed = how fast the cores run now against when the CPU costs were measured (a
virtual machine's cores change speed with the load of the machine under it; docs/twin.md "The host's
speed"). When the running set changes, every running item is advanced at the old
rate and rescheduled at the new one, so CPU seconds are conserved: what one thread's work costs, the
others' work waits for.

Why not a factor taken when work starts (the twin's first model): work started on an idle host kept its
short duration while later work piled onto the cores, so CPU seconds added by the scheduler and the
client (short, frequent pieces) barely moved a run that the runtime showed to be CPU-bound.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from dualpath.sim.kernel import Simulator

# Work this close to done is done (float residue of repeated advances).
_EPS_CPU_S = 1e-12


class CpuWork:
    __slots__ = ("thread", "total_cpu_s", "done_cpu_s", "weight", "then", "handle")

    def __init__(
        self, thread: str, total_cpu_s: float, weight: float, then: Callable[[], None] | None
    ) -> None:
        self.thread, self.total_cpu_s, self.weight, self.then = thread, total_cpu_s, weight, then
        self.done_cpu_s = 0.0
        self.handle: Any = None


class HostCpu:
    def __init__(
        self, sim: Simulator, capacity_cores: float, *, background: float = 0.0, speed: float = 1.0
    ) -> None:
        if capacity_cores <= 0.0 or background < 0.0 or speed <= 0.0:
            raise ValueError(
                f"need capacity_cores > 0, background >= 0 and speed > 0, got {capacity_cores}, "
                f"{background}, {speed}"
            )
        self.sim, self.capacity_cores, self.speed = sim, capacity_cores, speed
        self.background = background  # threads of ours kept busy all the time (weight), not modelled as work
        self._threads: dict[str, deque[CpuWork]] = {}
        self._per_weight = 1.0  # rate of a running item per unit of its weight
        self._last_s = 0.0
        self.cpu_s_by_thread: dict[str, float] = {}  # submitted, per thread (a record for reports)

    # ---- queries ----------------------------------------------------------------------------------
    def _running(self) -> list[CpuWork]:
        return [q[0] for q in self._threads.values() if q]

    def busy_weight(self) -> float:
        """W: the running items' weights and the background (threads kept busy)."""
        return self.background + sum(w.weight for w in self._running())

    def rate(self, extra: float = 0.0) -> float:
        """CPU seconds per second a whole thread gets with `extra` more busy threads: its share of a
        core, at the cores' speed."""
        total = self.busy_weight() + extra
        return self.speed * (1.0 if total <= 0.0 else min(1.0, self.capacity_cores / total))

    def done_cpu_s(self, work: CpuWork) -> float:
        """CPU seconds `work` has had so far (up to now)."""
        queue = self._threads.get(work.thread)
        if queue and queue[0] is work:
            return work.done_cpu_s + (self.sim.now_s - self._last_s) * self._per_weight * work.weight
        return work.done_cpu_s

    # ---- changes ----------------------------------------------------------------------------------
    def submit(
        self, thread: str, cpu_s: float, then: Callable[[], None] | None = None, *, weight: float = 1.0
    ) -> CpuWork:
        """Queue `cpu_s` of CPU on `thread`, keeping it `weight` busy; `then()` runs when it is done."""
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        work = CpuWork(thread, max(0.0, cpu_s), weight, then)
        self.cpu_s_by_thread[thread] = self.cpu_s_by_thread.get(thread, 0.0) + work.total_cpu_s
        self._advance()
        self._threads.setdefault(thread, deque()).append(work)
        self._reschedule()
        return work

    def set_total(self, work: CpuWork, cpu_s: float) -> None:
        """Change how much CPU `work` needs in all (a decode run cut short); not below what it had."""
        self._advance()
        total = max(cpu_s, work.done_cpu_s)
        self.cpu_s_by_thread[work.thread] += total - work.total_cpu_s
        work.total_cpu_s = total
        self._reschedule()

    # ---- the processor sharing --------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.sim.now_s
        elapsed = now - self._last_s
        if elapsed > 0.0:
            for work in self._running():
                work.done_cpu_s += elapsed * self._per_weight * work.weight
        self._last_s = now

    def _reschedule(self) -> None:
        self._per_weight = self.rate()
        for work in self._running():
            if work.handle is not None:
                self.sim.cancel(work.handle)
            left_s = max(0.0, work.total_cpu_s - work.done_cpu_s) / (self._per_weight * work.weight)
            work.handle = self.sim.schedule(left_s, self._finish, work)

    def _finish(self, work: CpuWork) -> None:
        self._advance()
        if work.total_cpu_s - work.done_cpu_s > _EPS_CPU_S * max(1.0, work.total_cpu_s):
            self._reschedule()  # a stale wake-up (rescheduled meanwhile); cannot happen, kept safe
            return
        self._threads[work.thread].popleft()
        work.handle = None
        self._reschedule()
        if work.then is not None:
            work.then()
