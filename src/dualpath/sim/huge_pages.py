"""Huge pages under the simulator's small objects (speed only; results unchanged).

NOTE: CPython's small-object allocator (pymalloc) takes its memory in 1 MiB arenas of 4 KiB pages. A
large simulation keeps gigabytes of small objects (48P96D: ≈ 4 GB of requests, flows, heap entries and
per-request records) and reaches them all over: far more 4 KiB pages than the TLB holds, and a TLB
miss costs a page-table walk (under a hypervisor, through the guest's and the host's tables). The
simulator's cost per event grows with the cluster (benchmarks/README.md: 3P6D 4.4 µs, 12P24D 7.1 µs,
48P96D 11.6 µs per event) with the same functions on top of `perf`'s profile at every size.
`_huge_arenas.c` gives pymalloc arenas cut from 2 MiB-aligned regions advised MADV_HUGEPAGE, which Linux
backs with transparent huge pages when /sys/kernel/mm/transparent_hugepage/enabled is `madvise` or
`always`; the gain measured at 48P96D (benchmarks/README.md) is what says the TLB mattered.

`use_huge_page_arenas()` installs it for the whole process, once (pymalloc has one arena allocator per
process) and for good: an arena must be freed by the allocator it came from. `Simulation.run` calls it;
`DUALPATH_HUGE_PAGES=0` leaves CPython's own allocator in place (to compare, or where huge pages are
unwanted). Without the compiled module (a pure-Python install) nothing changes.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

HUGE_PAGES_ENV = "DUALPATH_HUGE_PAGES"


def huge_pages_switched_off() -> bool:
    return os.environ.get(HUGE_PAGES_ENV, "") == "0"


def _arenas_module() -> ModuleType | None:
    """The compiled `_huge_arenas`, or None where it is not built (a pure-Python install)."""
    try:
        from dualpath.sim import _huge_arenas
    except ImportError:
        return None
    return _huge_arenas


def use_huge_page_arenas() -> bool:
    """Take pymalloc's arenas from huge-page regions from now on, in this process (idempotent). False when
    `DUALPATH_HUGE_PAGES=0` is set or the compiled module is not built."""
    module = None if huge_pages_switched_off() else _arenas_module()
    if module is None:
        return False
    module.install()
    return True


def arena_stats() -> dict[str, int | bool] | None:
    """The allocator's counters (`_huge_arenas.stats`), or None without the compiled module."""
    module = _arenas_module()
    return None if module is None else module.stats()


def anon_huge_page_bytes() -> int | None:
    """Bytes of this process's memory backed by transparent huge pages now (Linux; None elsewhere)."""
    rollup = Path("/proc/self/smaps_rollup")
    try:
        lines = rollup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return None
