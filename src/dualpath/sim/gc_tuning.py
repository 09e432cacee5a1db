"""Python's cyclic garbage collector held back while a simulation runs (speed only; results unchanged).

NOTE: a run allocates millions of short-lived objects (commands, load reports, heap entries) and frees
almost all of them by reference counting; the cyclic collector still scans the youngest generation every
700 allocations (CPython's default threshold) and, as the run's long-lived state grows, the older ones
too. `gc.freeze()` moves everything alive before the run (trajectories, topology, cost tables) out of the
collector's view, and a larger youngest-generation threshold makes scans rare. Measured on DS 660B 2P4D
64K, 512 agents, dualpath, native build, quiet machine: `sim_wall_s` 12.17 → 11.19 s (−8 %), peak memory
196 → 173 MB (benchmarks/README.md). Cycles are still collected, only less often. The collector's
settings are process-wide, so they are restored when the run ends (`held_back_gc` is a context manager).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Youngest-generation allocations between scans while a run is on (CPython's default is 700): rare enough
# to stay out of the profile, small enough that a scan is still short (measured above).
RUN_GEN0_THRESHOLD = 200_000


@contextmanager
def held_back_gc() -> Iterator[None]:
    """Freeze what exists now, scan rarely; on exit restore the thresholds and unfreeze."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(RUN_GEN0_THRESHOLD, thresholds[1], thresholds[2])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
