"""PNG plots: a value over time, and CDFs. Uses matplotlib's object API with the Agg canvas, so no
global pyplot state and no display is needed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_time_series(
    path: str | Path,
    time_s: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    title: str = "",
    ylabel: str = "",
) -> Path:
    figure, axes = _figure()
    for name, values in series.items():
        axes.plot(time_s, values, label=name)
    axes.set_xlabel("time (s)")
    axes.set_ylabel(ylabel)
    return _save(figure, axes, path, title, legend=len(series) > 0)


def plot_cdf(
    path: str | Path,
    samples: Mapping[str, Sequence[float]],
    *,
    title: str = "",
    xlabel: str = "",
) -> Path:
    figure, axes = _figure()
    for name, values in samples.items():
        ordered = np.sort(np.asarray(values, dtype=float))
        if ordered.size:
            axes.step(ordered, np.arange(1, ordered.size + 1) / ordered.size, where="post", label=name)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("fraction ≤ x")
    axes.set_ylim(0, 1.02)
    return _save(figure, axes, path, title, legend=len(samples) > 0)


def _figure() -> tuple[Figure, Axes]:
    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _save(figure: Figure, axes: Axes, path: str | Path, title: str, *, legend: bool) -> Path:
    path = Path(path)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if legend:
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path
