"""Matplotlib figures for the reproduce report (Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def _pyplot():  # type: ignore[no-untyped-def]
    """Import matplotlib on first use: `dualpath --help` should not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def lines(
    path: Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float | None]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    hline: float | None = None,
) -> Path:
    """One line per series; `None` values are skipped (a run that failed or did not report)."""
    fig, ax = _pyplot().subplots(figsize=(6, 3.6))
    for label, (xs, ys) in series.items():
        points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def bars(
    path: Path, groups: Mapping[str, Mapping[str, float]], *, title: str, ylabel: str, stacked: bool = False
) -> Path:
    """Grouped (or stacked) bars: `groups[group][part] = value`."""
    fig, ax = _pyplot().subplots(figsize=(6, 3.6))
    names = list(groups)
    parts = sorted({part for values in groups.values() for part in values}, key=_first_seen(groups))
    width = 0.8 if stacked else 0.8 / max(1, len(parts))
    bottoms = [0.0] * len(names)
    for i, part in enumerate(parts):
        values = [groups[name].get(part, 0.0) for name in names]
        xs = [j + (0 if stacked else (i - (len(parts) - 1) / 2) * width) for j in range(len(names))]
        ax.bar(xs, values, width=width, label=part, bottom=bottoms if stacked else None)
        if stacked:
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
    ax.set(title=title, ylabel=ylabel)
    ax.grid(alpha=0.3, axis="y")
    if parts:  # groups with no values (a run that recorded none) draw empty axes, without a legend
        ax.legend(fontsize=8)
    return _save(fig, path)


def _first_seen(groups: Mapping[str, Mapping[str, float]]):  # type: ignore[no-untyped-def]
    order: dict[str, int] = {}
    for values in groups.values():
        for part in values:
            order.setdefault(part, len(order))
    return order.__getitem__


def _save(fig, path: Path) -> Path:  # type: ignore[no-untyped-def]
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path
