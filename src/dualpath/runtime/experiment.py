"""One trace replayed on a fresh local cluster per mode: what `dualpath demo` and the benchmark run.

Each mode gets its own `dualpath serve` child and its own empty KV store, so no mode sees another's
blocks. Results are plain dicts (one per mode), so a caller can put other columns beside them — e.g. the
simulator's prediction for the same set-up.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from dualpath.runtime.bench import BenchOptions
from dualpath.runtime.bench import run as run_bench
from dualpath.runtime.launcher import ServeProcess


def run_mode(
    mode: str,
    options: BenchOptions,
    *,
    config: str = "local-1p2d",
    settings: Sequence[str] = (),
    progress: bool = True,
    log_path: Path | None = None,
) -> dict[str, object]:
    extra = tuple(arg for item in settings for arg in ("--set", item))
    with (
        tempfile.TemporaryDirectory(prefix="dualpath-store-") as store,
        ServeProcess(config, mode=mode, store_dir=Path(store), extra_args=extra, log_path=log_path) as server,
    ):
        summary, _ = run_bench(server.url, options, progress=progress)
    summary["mode"] = mode
    return summary


def run_modes(
    modes: Sequence[str],
    options: BenchOptions,
    *,
    config: str = "local-1p2d",
    settings: Sequence[str] = (),
    progress: bool = True,
    log_path: Path | None = None,
) -> dict[str, dict[str, object]]:
    return {
        mode: run_mode(mode, options, config=config, settings=settings, progress=progress, log_path=log_path)
        for mode in modes
    }


def snic_utilisation(summary: dict) -> dict[str, float]:
    """Per node: fraction of its emulated SNIC bandwidth used while it had reads waiting (0 if none)."""
    return {node: float(d["utilisation"] or 0.0) for node, d in summary["snic"].items()}


def demo_row(summary: dict) -> dict[str, object]:
    """The measured columns of one demo table row."""
    return {
        "mode": summary["mode"],
        "jct_s": summary["jct_s"],
        "ttft_mean_s": summary["ttft_s"]["mean"],
        "ttft_p90_s": summary["ttft_s"]["p90"],
        "tpot_mean_s": summary["tpot_s"]["mean"],
        "tokens_per_s": summary["tokens_per_s"],
        "snic_utilisation": snic_utilisation(summary),
        "snic_read_bytes": {node: d["rx"] for node, d in summary["snic"].items()},
        "scheduler_rates": dict(summary.get("scheduler_rates", {})),  # β and the §6.4 quota's inputs
    }


def format_table(rows: Sequence[dict]) -> str:
    nodes = sorted({n for row in rows for n in row["snic_utilisation"]})
    head = f"{'mode':<12}{'JCT s':>8}{'TTFT s':>9}{'TTFT p90':>10}{'TPOT ms':>9}{'tok/s':>8}"
    head += "".join(f"{'SNIC ' + n:>10}" for n in nodes)
    lines = [head, "-" * len(head)]
    for row in rows:
        line = f"{row['mode']:<12}{row['jct_s']:>8.2f}{row['ttft_mean_s']:>9.3f}{row['ttft_p90_s']:>10.3f}"
        line += f"{row['tpot_mean_s'] * 1e3:>9.1f}{row['tokens_per_s']:>8.1f}"
        line += "".join(f"{100 * row['snic_utilisation'].get(n, 0.0):>9.0f}%" for n in nodes)
        lines.append(line)
    lines.append("SNIC columns: share of the emulated SNIC bandwidth used while that node had reads waiting.")
    return "\n".join(lines)
