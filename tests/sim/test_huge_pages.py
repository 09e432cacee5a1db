"""pymalloc's arenas on huge pages (sim/huge_pages.py, sim/_huge_arenas.c): installed by a run, serving
and reusing arenas, switched off by DUALPATH_HUGE_PAGES=0, and the same results either way.

Each check runs in a child process: the allocator is the whole process's, installed for good."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dualpath.sim import huge_pages

SRC = Path(huge_pages.__file__).resolve().parents[2]
needs_build = pytest.mark.skipif(
    huge_pages.arena_stats() is None, reason="no native build here (make / pip install -e . builds it)"
)


def python(code: str, *, switched_off: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if k != huge_pages.HUGE_PAGES_ENV}
    env["PYTHONPATH"] = str(SRC)
    if switched_off:
        env[huge_pages.HUGE_PAGES_ENV] = "0"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return done.stdout


# ≈ 100 MB of small objects (pymalloc's), freed, then made again: the second time from freed arenas.
CHURN = """
import json
from dualpath.sim.huge_pages import arena_stats, use_huge_page_arenas
installed = use_huge_page_arenas()
made = [(i, float(i)) for i in range(1_000_000)]
after_made = arena_stats()
del made
after_freed = arena_stats()
again = [(i, str(i)) for i in range(1_000_000)]
print(json.dumps([installed, after_made, after_freed, arena_stats(), sum(len(s) for _, s in again)]))
"""


@needs_build
def test_arenas_come_from_the_regions_and_freed_ones_are_reused() -> None:
    installed, made, freed, again, total = json.loads(python(CHURN))
    assert installed is True and made["installed"] is True
    assert made["arena_bytes"] > 0 and made["regions"] >= 1
    assert made["arenas_cut"] * made["arena_bytes"] >= 50_000_000  # the objects live in the regions
    assert made["arenas_cut"] * made["arena_bytes"] <= made["regions"] * made["region_bytes"]
    assert freed["arenas_freed"] > 0  # pymalloc gave emptied arenas back ...
    assert again["arenas_reused"] > 0  # ... and got them again
    assert total == sum(len(str(i)) for i in range(1_000_000))  # and the objects in them are intact


@needs_build
def test_switched_off_leaves_cpythons_allocator() -> None:
    installed, made, _, _, _ = json.loads(python(CHURN, switched_off=True))
    assert installed is False
    assert made["installed"] is False and made["arenas_cut"] == 0


RUN = """
import json
from dualpath.cli.main import main
from dualpath.sim.huge_pages import arena_stats
main(["simulate", "--model", "ds-27b", "--p", "1", "--d", "2", "--agents", "16", "--json", "--quiet"])
print(json.dumps(arena_stats()))
"""


@needs_build
def test_a_run_installs_them_and_gives_the_same_results_as_without() -> None:
    on_result, on_stats = python(RUN).strip().rsplit("\n", 1)
    off_result, off_stats = python(RUN, switched_off=True).strip().rsplit("\n", 1)
    assert json.loads(on_stats)["installed"] is True
    assert json.loads(off_stats)["installed"] is False
    on, off = json.loads(on_result), json.loads(off_result)
    on.pop("sim_wall_s"), off.pop("sim_wall_s")
    assert on == off
