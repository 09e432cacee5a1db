from pathlib import Path

from dualpath.metrics.plots import plot_cdf, plot_time_series

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_time_series_plot_writes_png(tmp_path: Path) -> None:
    path = plot_time_series(tmp_path / "a.png", [0, 1, 2], {"queue": [1, 3, 2]}, title="q", ylabel="requests")
    assert path == tmp_path / "a.png"
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_cdf_plot_writes_png(tmp_path: Path) -> None:
    path = plot_cdf(tmp_path / "c.png", {"ttft": [0.5, 1.0, 3.0], "empty": []}, xlabel="TTFT (s)")
    assert path.read_bytes().startswith(PNG_MAGIC)
