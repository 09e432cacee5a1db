"""The reproduce report: one page with every experiment's table and plots, and our numbers beside the
paper's headline claims. Written as Markdown (for reading in a terminal or a repository) and as a
self-contained HTML file (plots embedded as base64 PNG, so the file can be mailed around)."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from dualpath.experiments.claims import CLAIMS_BY_KEY
from dualpath.experiments.page_check import FIGURE_CHECK_SCRIPT
from dualpath.experiments.section import PAGE_STYLE, Section, section_html


def claims_rows(sections: Sequence[Section]) -> list[list[object]]:
    rows: list[list[object]] = []
    for section in sections:
        for check in section.claims:
            claim = CLAIMS_BY_KEY[check.claim_key]
            ours = None if check.ours is None else round(check.ours, 3)
            off = None if check.ours is None else round(100 * (check.ours / claim.paper_value - 1), 1)
            rows.append([claim.text, claim.source, claim.paper_value, ours, off, check.note])
    return rows


CLAIM_COLUMNS = ["claim", "paper", "paper value", "ours", "difference %", "note"]


def write_report(out_dir: Path, sections: Sequence[Section], *, quick: bool, header: str) -> dict[str, Path]:
    claims = Section(
        name="claims",
        title="Headline claims",
        paper_ref="§11",
        columns=CLAIM_COLUMNS,
        rows=claims_rows(sections),
    )
    md = [
        f"# DualPath reproduce report{' (quick)' if quick else ''}",
        "",
        header,
        "",
        "## Headline claims beside ours",
        "",
        claims.markdown_table(),
        "",
    ]
    for section in sections:
        md += [f"## {section.title} ({section.paper_ref})", "", section.markdown_table(), ""]
        md += [f"- note: {note}" for note in section.notes]
        md += [f"![{p.stem}]({p.relative_to(out_dir)})" for p in section.plots]
        md.append("")
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(md))
    html_path = out_dir / "report.html"
    html_path.write_text(_html(out_dir, [claims, *sections], quick=quick, header=header))
    json_path = out_dir / "report.json"
    json_path.write_text(
        json.dumps(
            {
                "quick": quick,
                "claims": [dict(zip(CLAIM_COLUMNS, row, strict=True)) for row in claims.rows],
                "experiments": {
                    s.name: {
                        "title": s.title,
                        "paper_ref": s.paper_ref,
                        "columns": s.columns,
                        "rows": s.rows,
                        "data": s.data,
                        "notes": s.notes,
                        "plots": [str(p.relative_to(out_dir)) for p in s.plots],
                    }
                    for s in sections
                },
            },
            indent=2,
            default=str,
        )
    )
    return {"markdown": md_path, "html": html_path, "json": json_path}


def _html(out_dir: Path, sections: Sequence[Section], *, quick: bool, header: str) -> str:
    parts = [
        "<!doctype html><meta charset='utf-8'><title>DualPath reproduce report</title>",
        PAGE_STYLE,
        f"<h1>DualPath reproduce report{' (quick)' if quick else ''}</h1><p>{html.escape(header)}</p>",
    ]
    for section in sections:
        parts.append(
            f"<h2>{html.escape(section.title)} <small>({html.escape(section.paper_ref)})</small></h2>"
        )
        parts += section_html(section)
    parts.append(FIGURE_CHECK_SCRIPT)  # the browser test's probe (page_check.py)
    return "\n".join(parts)
