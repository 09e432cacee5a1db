"""Python's cyclic garbage collector off while a simulation runs (speed only; results unchanged).

NOTE: a run allocates millions of short-lived objects (commands, load reports, heap entries) and frees
every one of them by reference counting: a run makes no reference cycles (tests/sim/test_gc_tuning.py
runs every mode and finds nothing for the collector to collect). The collector would still scan the
youngest generation every 700 allocations (CPython's default threshold) and, as the results grow
(millions of per-request records at 48P96D), rescan the long-lived ones in the older generations: work
that can never find anything. So it is off for the run and back on (as it was) when the run ends or
raises; a cycle made during the run by someone else's callback is collected later.

Everything the run made and kept (its results) is then in the youngest generation, which the collector
would scan whole at the next allocation (tens of millions of objects at 48P96D). `gc.freeze()` then
`gc.unfreeze()` moves it to the oldest generation instead, by splicing lists, without a scan: the
oldest generation is scanned only when it has grown by a quarter since its last scan. (This also puts
back what someone froze before the run; nothing in this package freezes.)

Measured (benchmarks/README.md): the previous setting, a frozen collector scanning every 200,000
allocations, cut DS 660B 2P4D 64K 512 agents from 12.17 to 11.19 s of `sim_wall_s` against CPython's
defaults, and still spent 3.5 s of the first 160 s of CPU of the 48P96D run in scans.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_back_gc() -> Iterator[None]:
    """The cyclic collector off inside; on exit, on again if it was on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # the run's objects: youngest generation -> permanent -> oldest, unscanned
        gc.unfreeze()
        if was_enabled:
            gc.enable()
