"""What one experiment produces: a table, JSON data, plots and claim comparisons."""

from __future__ import annotations

import base64
import html
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


# The style both HTML reports (reproduce, sweep) share.
PAGE_STYLE = (
    "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:48%}</style>"
)


def section_html(section: Section) -> list[str]:
    """A section's table, notes and plots (inlined as PNG data, so the page stands alone), as HTML lines."""
    parts = ["<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in section.columns) + "</tr>"]
    for row in section.rows:
        parts.append("<tr>" + "".join(f"<td>{html.escape(format_cell(v))}</td>" for v in row) + "</tr>")
    parts.append("</table>")
    parts += [f"<p><i>note: {html.escape(n)}</i></p>" for n in section.notes]
    for plot in section.plots:
        data = base64.b64encode(plot.read_bytes()).decode()
        parts.append(f"<img alt='{html.escape(plot.stem)}' src='data:image/png;base64,{data}'>")
    return parts
