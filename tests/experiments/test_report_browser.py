"""The self-contained HTML reports in a real headless browser (Debian's `chromium`): every figure decodes,
the console has no errors, and a screenshot is kept beside the page."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dualpath.experiments import plots
from dualpath.experiments.executors import RunOutcome
from dualpath.experiments.report import write_report
from dualpath.experiments.section import Section
from dualpath.experiments.sweep import parse_sweep
from dualpath.experiments.sweep_report import write_sweep

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")


def browse(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=10000", "--window-size=1200,2400", *extra, page.resolve().as_uri()]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def check_page(page: Path, figures: int) -> None:
    dom = browse(page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-500:]
    # page_check.py's probe ran in the browser after load and counted the decoded figures.
    assert f'data-figures-loaded="{figures}/{figures}"' in dom.stdout
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
    shot = browse(page, f"--screenshot={page.parent / 'screenshot.png'}")
    assert shot.returncode == 0 and (page.parent / "screenshot.png").stat().st_size > 1000


def test_the_probe_reports_a_broken_figure(tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    from dualpath.experiments.page_check import FIGURE_CHECK_SCRIPT

    page = tmp_path / "broken.html"
    page.write_text(
        f"<!doctype html><title>t</title><img alt='gone' src='data:image/png;base64,AAAA'>{FIGURE_CHECK_SCRIPT}"
    )
    dom = browse(page, "--dump-dom")
    assert 'data-figures-loaded="0/1"' in dom.stdout
    assert re.search(r"CONSOLE.*figure did not load: gone", dom.stderr)


@needs_chromium
def test_sweep_report_loads_in_a_browser(tmp_path: Path) -> None:
    raw = {"name": "page", "base": {"model": "ds-27b", "layout": "1P1D"},
           "grid": {"mode": ["basic", "dualpath"], "agents": [1, 2]}, "metrics": ["jct_s", "ttft_s.p90"]}  # fmt: skip
    sweep = parse_sweep(raw, where="t", folder=tmp_path)
    outcomes = {r.spec.key(): RunOutcome(spec=r.spec, result={"jct_s": 10.0 * r.spec.agents,
                "ttft_s": {"p90": 0.5 * r.spec.agents}}) for r in sweep.runs}  # fmt: skip
    paths = write_sweep(sweep, outcomes, tmp_path / "sweep", header="test")
    check_page(paths["html"], figures=2)


@needs_chromium
def test_reproduce_report_loads_in_a_browser(tmp_path: Path) -> None:
    figure = plots.lines(tmp_path / "plots" / "f.png", {"basic": ([1.0, 2.0], [3.0, 4.0])}, title="t",
                         xlabel="x", ylabel="y")  # fmt: skip
    section = Section(name="s", title="S", paper_ref="§7", columns=["a"], rows=[[1.0]], plots=[figure])
    paths = write_report(tmp_path, [section], quick=True, header="test")
    check_page(paths["html"], figures=1)
