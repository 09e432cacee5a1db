"""What one experiment produces: a table, JSON data, plots and claim comparisons."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ClaimCheck:
    claim_key: str
    ours: float | None
    note: str = ""


@dataclass(kw_only=True)
class Section:
    name: str
    title: str
    paper_ref: str
    columns: list[str]
    rows: list[list[object]] = field(default_factory=list)
    data: dict[str, object] = field(default_factory=dict)
    plots: list[Path] = field(default_factory=list)
    claims: list[ClaimCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown_table(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(format_cell(v) for v in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def text_table(self) -> str:
        cells = [self.columns] + [[format_cell(v) for v in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        out = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(out)


def format_cell(value: object) -> str:
    """One table cell: 3 significant digits, thousands separators for large numbers, — for missing."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "—" if value is None else str(value)
