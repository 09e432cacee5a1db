"""`benchmarks/sim_instructions.py`: the event loop's instruction count under callgrind."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def script(benchmark_script: Callable[[str], ModuleType]) -> ModuleType:
    return benchmark_script("sim_instructions")


def test_reads_the_count_callgrind_prints_at_exit(script: ModuleType) -> None:
    stderr = (
        "==4242== Callgrind, a call-graph generating cache profiler\n"
        "==4242== Events    : Ir\n"
        "==4242== Collected : 3694462722\n"
        "==4242== I   refs:      3,694,462,722\n"
    )
    assert script.collected(stderr) == {"Ir": 3_694_462_722}


def test_reads_each_events_count_with_the_caches_simulated(script: ModuleType) -> None:
    stderr = (
        "==15712== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
        "==15712== Collected : 18000093953 4939293487 2750448737 222512398 173268372 70129989 1621914 20650612 12659646\n"
    )
    counts = script.collected(stderr)
    assert counts["Ir"] == 18_000_093_953
    assert (counts["DLmr"], counts["DLmw"]) == (20_650_612, 12_659_646)


def test_no_count_is_an_error_with_callgrinds_output(script: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="valgrind: failed to start"):
        script.collected("valgrind: failed to start tool 'callgrind'\n")


def test_the_simulated_case_is_the_one_asked_for(script: ModuleType) -> None:
    args = script.simulate_args(3, 5, 17, "basic")
    assert args[args.index("--p") + 1] == "3"
    assert args[args.index("--d") + 1] == "5"
    assert args[args.index("--agents") + 1] == "17"
    assert args[args.index("--mode") + 1] == "basic"
    assert "--json" in args


def test_without_valgrind_it_says_how_to_get_it(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="apt-get install valgrind"):
        script.count(2, 4, 1, "dualpath")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_counts_a_tiny_run(script: ModuleType) -> None:
    from dualpath.native import compiled_modules

    if not compiled_modules():
        pytest.skip("needs the native build")
    row = script.count(2, 4, 2, "dualpath")
    assert row["events"] > 0 and row["requests"] > 0
    assert row["instructions"] > 1000 * row["events"]  # an event is thousands of instructions, not zero
    assert row["instructions_per_event"] == pytest.approx(row["instructions"] / row["events"])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_counts_a_tiny_runs_misses_in_a_small_cache(script: ModuleType) -> None:
    from dualpath.native import compiled_modules

    if not compiled_modules():
        pytest.skip("needs the native build")
    row = script.count(2, 4, 2, "dualpath", cache_bytes=65536)
    assert row["cache_bytes"] == 65536
    assert 0 < row["ll_read_misses"] < row["instructions"]
    assert row["ll_misses_per_event"] == pytest.approx(
        (row["ll_read_misses"] + row["ll_write_misses"]) / row["events"]
    )
