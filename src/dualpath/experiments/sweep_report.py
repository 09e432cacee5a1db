"""A sweep's outputs: every run as JSON and a table, one figure per metric against the swept axis (one
line per mode and other axis values), and a report page (Markdown, and HTML with the figures inlined)."""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dualpath.experiments import plots
from dualpath.experiments.page_check import FIGURE_CHECK_SCRIPT
from dualpath.experiments.runner import RunOutcome
from dualpath.experiments.scenarios import metric
from dualpath.experiments.section import PAGE_STYLE, Section, section_html
from dualpath.experiments.sweep import Sweep, SweepRun

# Seconds of wall clock: the only field of a simulate result that differs between two runs of one spec.
WALL_CLOCK_KEYS = ("sim_wall_s",)


def metric_value(result: Mapping[str, Any] | None, name: str) -> float | None:
    """`jct_s`, or `ttft_s.p90` (a statistic of a {mean, p50, p90, p99} entry)."""
    key, _, stat = name.partition(".")
    return metric(dict(result) if result else None, key, stat or "mean")


def run_record(run: SweepRun, outcome: RunOutcome | None, metrics: tuple[str, ...]) -> dict[str, Any]:
    result = outcome.result if outcome else None
    return {
        "label": run.spec.label(),
        "key": run.spec.key(),
        "values": run.values,
        "spec": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(run.spec).items()},
        "ok": result is not None,
        "error": None if outcome is None else outcome.error,
        "metrics": {m: metric_value(result, m) for m in metrics},
        "result": None if result is None else {k: v for k, v in result.items() if k not in WALL_CLOCK_KEYS},
    }


def write_sweep(
    sweep: Sweep, outcomes: Mapping[str, RunOutcome], out_dir: Path, header: str
) -> dict[str, Path]:
    """results.json (deterministic: no wall-clock fields), timings.json, table.md/.csv, plots, report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [run_record(run, outcomes.get(run.spec.key()), sweep.metrics) for run in sweep.runs]
    shown = [m for m in sweep.metrics if any(r["metrics"][m] is not None for r in records)]
    results = {"name": sweep.name, "title": sweep.title, "about": sweep.about, "axes": list(sweep.axes),
               "x": sweep.x, "metrics": list(sweep.metrics), "runs": records}  # fmt: skip
    paths = {"json": out_dir / "results.json", "timings": out_dir / "timings.json"}
    paths["json"].write_text(json.dumps(results, indent=1, sort_keys=True, default=str) + "\n")
    timings = {r["key"]: (o.result or {}).get("sim_wall_s") for r in records if (o := outcomes.get(r["key"]))}
    paths["timings"].write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")
    section = _section(sweep, records, shown)
    section.plots = [_figure(sweep, records, m, out_dir / "plots") for m in shown if sweep.x is not None]
    paths["csv"] = out_dir / "table.csv"
    with paths["csv"].open("w", newline="") as f:
        csv.writer(f).writerows([section.columns, *section.rows])
    paths["markdown"] = out_dir / "report.md"
    paths["markdown"].write_text(_markdown(sweep, section, out_dir, header))
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(_html(sweep, section, header))
    return paths


def _section(sweep: Sweep, records: list[dict[str, Any]], shown: list[str]) -> Section:
    section = Section(name=sweep.name, title=sweep.title, paper_ref="sweep", columns=[*sweep.axes, *shown])
    for r in records:
        section.rows.append([*(r["values"].get(a) for a in sweep.axes), *(r["metrics"][m] for m in shown)])
        if not r["ok"]:
            section.notes.append(f"run failed: {r['label']}: {r['error'] or 'no result'}")
    return section


def _figure(sweep: Sweep, records: list[dict[str, Any]], name: str, plot_dir: Path) -> Path:
    """`name` against the x axis; one line per combination of the other axes (mode first)."""
    assert sweep.x is not None
    # Axes that the x value decides (a layout per hardware) would split every line into single points.
    others = sorted((a for a in sweep.axes if a != sweep.x and not _follows(a, sweep.x, records)),
                    key=lambda a: a != "mode")  # fmt: skip
    xs_all = list(dict.fromkeys(r["values"].get(sweep.x) for r in records))
    numeric = all(isinstance(x, int | float) for x in xs_all)
    series: dict[str, tuple[list[float], list[float | None]]] = {}
    for r in records:
        label = ", ".join(
            f"{r['values'].get(a)}" if a == "mode" else f"{a}={r['values'].get(a)}" for a in others
        )
        xs, ys = series.setdefault(label or name, ([], []))
        x = r["values"].get(sweep.x)
        xs.append(float(x) if numeric else float(xs_all.index(x)))
        ys.append(r["metrics"][name])
    path = plot_dir / f"{_slug(name)}-vs-{_slug(sweep.x)}.png"
    return _draw(path, series, None if numeric else xs_all, title=f"{sweep.name}: {name}", xlabel=sweep.x,
                 ylabel=name)  # fmt: skip


def _draw(
    path: Path, series: Any, categories: list[Any] | None, *, title: str, xlabel: str, ylabel: str
) -> Path:
    """plots.lines, with the category names on x when the swept axis is not a number."""
    if categories is None:
        return plots.lines(path, series, title=title, xlabel=xlabel, ylabel=ylabel)
    fig, ax = plots._pyplot().subplots(figsize=(6, 3.6))
    for label, (xs, ys) in series.items():
        points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set_xticks(range(len(categories)), [str(c) for c in categories], rotation=15, fontsize=8)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return plots._save(fig, path)


def _follows(axis: str, x: str, records: list[dict[str, Any]]) -> bool:
    """Whether each x value comes with one value of `axis` only (and `axis` is not the mode)."""
    seen: dict[Any, Any] = {}
    return axis != "mode" and all(seen.setdefault(r["values"].get(x), r["values"].get(axis)) == r["values"].get(axis)
                                  for r in records)  # fmt: skip


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")


def _markdown(sweep: Sweep, section: Section, out_dir: Path, header: str) -> str:
    md = [f"# {sweep.title}", "", header, ""]
    if sweep.about:
        md += [sweep.about, ""]
    md += [section.markdown_table(), ""]
    md += [f"- note: {note}" for note in section.notes]
    md += [f"![{p.stem}]({p.relative_to(out_dir)})" for p in section.plots]
    return "\n".join(md) + "\n"


def _html(sweep: Sweep, section: Section, header: str) -> str:
    parts = [
        f"<!doctype html><html lang='en'><meta charset='utf-8'><title>{html.escape(sweep.title)}</title>",
        PAGE_STYLE,
        f"<h1>{html.escape(sweep.title)}</h1><p>{html.escape(header)}</p>",
    ]
    if sweep.about:
        parts.append(f"<p>{html.escape(sweep.about)}</p>")
    parts += section_html(section)
    parts.append(FIGURE_CHECK_SCRIPT)
    return "\n".join(parts) + "\n"
