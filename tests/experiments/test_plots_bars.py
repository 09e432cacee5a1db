"""`experiments.plots.bars`: grouped and stacked bars, and a figure with nothing to draw."""

from __future__ import annotations

import warnings
from pathlib import Path

from dualpath.experiments.plots import bars


def test_bars_write_a_png_with_a_legend_per_part(tmp_path: Path) -> None:
    path = bars(tmp_path / "b.png", {"basic": {"read": 2.0, "compute": 1.0}, "dualpath": {"read": 1.0}},
                title="t", ylabel="s", stacked=True)  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_groups_without_values_draw_empty_axes_without_a_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns when a legend has no labelled artists
        path = bars(tmp_path / "empty.png", {"basic": {}, "dualpath": {}}, title="t", ylabel="s")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
