"""The planner's answers as one JSON-ready dict, and the same as aligned text tables."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dualpath import units
from dualpath.architecture import arch
from dualpath.config.specs import HardwareSpec, ModelSpec
from dualpath.plan.bounds import PdRange, pd_range
from dualpath.plan.ratio import (
    PAPER_TABLE1,
    TABLE1_APPEND_TOKENS,
    TABLE1_BINARY_CONTEXTS,
    TABLE1_CONTEXTS,
    TABLE1_NOTES,
    TABLE1_TOLERANCE,
    kv_working_set,
    ratio_by_context,
)
from dualpath.plan.traffic import link_loads


def plan(
    hw: HardwareSpec,
    model: ModelSpec,
    *,
    num_prefill_nodes: int,
    num_decode_nodes: int,
    context_tokens: int | None = None,
    append_tokens: int = TABLE1_APPEND_TOKENS,
    working_set_inputs: tuple[float, float, float] | None = None,  # (APS, mean JCT s, mean total tokens)
) -> dict[str, Any]:
    """Everything `dualpath plan` prints, in base SI units."""
    rng = pd_range(hw)
    contexts = dict(TABLE1_CONTEXTS)
    if context_tokens is not None:
        contexts[str(context_tokens)] = context_tokens
    result: dict[str, Any] = {
        "hardware": hw.name,
        "model": model.name,
        "gpus_per_node": hw.gpus_per_node,
        "snic_to_cnic_ratio": hw.snic_bytes_per_s / hw.cnic_bytes_per_s,  # the paper's s
        **_range_fields(rng),
        **_links_at(hw, rng, num_prefill_nodes, num_decode_nodes),
        "kv_bytes_per_token_per_layer": arch.kv_bytes_per_token_per_layer(model),
        "kv_bytes_per_token": arch.kv_bytes_per_token(model),
        "append_tokens": append_tokens,
        "context_tokens": contexts,
        "cache_compute_gb_per_pflop": ratio_by_context(model, contexts, append_tokens),
    }
    if working_set_inputs is not None:
        aps, jct_s, total_tokens = working_set_inputs
        ws = kv_working_set(model, aps, jct_s, total_tokens)
        result["working_set"] = {
            "agents_per_s": aps,
            "mean_jct_s": jct_s,
            "mean_total_tokens": total_tokens,
            "tokens": ws.tokens,
            "kv_bytes": ws.kv_bytes,
        }
    return result


def table1(models: list[ModelSpec], *, binary_k: bool = False) -> dict[str, Any]:
    """Paper Table 1 for the given models, beside the paper's two printed ends of each row."""
    contexts = TABLE1_BINARY_CONTEXTS if binary_k else TABLE1_CONTEXTS
    rows = []
    for m in models:
        ratios = ratio_by_context(m, contexts, TABLE1_APPEND_TOKENS)
        row: dict[str, Any] = {"model": m.name, "cache_compute_gb_per_pflop": ratios}
        if m.name in PAPER_TABLE1:
            paper_16k, paper_64k = PAPER_TABLE1[m.name]
            row["paper_gb_per_pflop"] = {"16K": paper_16k, "64K": paper_64k}
            row["deviation"] = {"16K": ratios["16K"] / paper_16k - 1, "64K": ratios["64K"] / paper_64k - 1}
            if max(abs(x) for x in row["deviation"].values()) > TABLE1_TOLERANCE:
                row["note"] = TABLE1_NOTES.get(m.name, "outside 10 % of the paper; no explanation recorded")
        rows.append(row)
    return {"append_tokens": TABLE1_APPEND_TOKENS, "context_tokens": contexts, "rows": rows}


def _range_fields(rng: PdRange) -> dict[str, Any]:
    upper = rng.pd_ratio_max
    return {
        "pd_ratio_min": float(rng.pd_ratio_min),
        "pd_ratio_max": float(upper) if upper is not None else None,
        "pd_ratio_min_fraction": _fraction_text(rng.pd_ratio_min),
        "pd_ratio_max_fraction": _fraction_text(upper) if upper is not None else None,
        "range_is_empty": rng.is_empty,
        "binding_constraint": list(rng.binding_upper),
        "binding_constraint_lower": list(rng.binding_lower),
        "infeasible_links": list(rng.infeasible_links),
        "constraints": [
            {
                "link": b.link.label,
                "paper_equation": b.link.paper_equation,
                "pd_ratio_min": float(b.pd_ratio_min),
                "pd_ratio_max": float(b.pd_ratio_max) if b.pd_ratio_max is not None else None,
                "feasible": b.feasible,
            }
            for b in rng.bounds
        ],
    }


def _links_at(hw: HardwareSpec, rng: PdRange, p: int, d: int) -> dict[str, Any]:
    links = []
    for load in link_loads(hw):
        used = load.bytes_per_s(p, d)
        links.append(
            {
                "link_id": load.link_id,
                "link": load.label,
                "direction": _direction(load.link_id),
                "scope": load.scope,
                "steps": load.steps,
                "bytes_per_s": float(used),
                "capacity_bytes_per_s": float(load.capacity_bytes_per_s),
                "utilisation": float(used / load.capacity_bytes_per_s),
                "within_capacity": used <= load.capacity_bytes_per_s,
            }
        )
    storage_used = (p + d) * hw.snic_bytes_per_s  # every SNIC saturated (§4.2 assumption)
    return {
        "num_prefill_nodes": p,
        "num_decode_nodes": d,
        "pd_ratio": p / d,
        "bottleneck_free": rng.contains(p, d),
        "links": links,
        "storage": {
            "bytes_per_s": storage_used,
            "capacity_bytes_per_s": hw.storage_bytes_per_s,
            "utilisation": storage_used / hw.storage_bytes_per_s,
            "within_capacity": storage_used <= hw.storage_bytes_per_s,
        },
    }


def _direction(link_id: str) -> str:
    if link_id.endswith("_read"):
        return "read"
    return "write" if link_id.endswith("_write") else "read+write"


def _fraction_text(x: Fraction) -> str:
    near = x.limit_denominator(1000)
    return f"{near.numerator}/{near.denominator}" if near == x else f"{float(x):.6g}"


# ----------------------------------------------------------------------------------------------
# Text
# ----------------------------------------------------------------------------------------------


def render_plan(result: dict[str, Any]) -> str:
    lines = [
        f"hardware {result['hardware']}  model {result['model']}  g={result['gpus_per_node']}  "
        f"s={result['snic_to_cnic_ratio']:.3g}",
        "",
    ]
    lines += _render_range(result)
    lines += ["", _render_links(result), ""]
    lines += _render_ratio(result)
    if "working_set" in result:
        ws = result["working_set"]
        lines += [
            "",
            f"KV working set (§8.2): λ·T̄·L̄/2 = {ws['agents_per_s']:g} APS × {units.format_duration(ws['mean_jct_s'])}"
            f" × {ws['mean_total_tokens']:,.0f} tokens / 2 = {ws['tokens']:,.0f} tokens = "
            f"{units.format_bytes(ws['kv_bytes'])}",
        ]
    return "\n".join(lines)


def _render_range(result: dict[str, Any]) -> list[str]:
    upper = result["pd_ratio_max_fraction"] or "inf"
    lines = [f"bottleneck-free range (§4.2 eq. 9): {result['pd_ratio_min_fraction']} <= P/D <= {upper}"]
    if result["range_is_empty"]:
        lines.append(
            f"  EMPTY: no P/D is bottleneck-free (infeasible: {', '.join(result['infeasible_links'])})"
        )
    lines.append(f"  lower end set by: {', '.join(result['binding_constraint_lower']) or '-'}")
    lines.append(f"  upper end set by: {', '.join(result['binding_constraint']) or '-'}")
    rows = [
        [
            c["link"],
            c["paper_equation"],
            f"{c['pd_ratio_min']:.4g}",
            "inf" if c["pd_ratio_max"] is None else f"{c['pd_ratio_max']:.4g}",
            "" if c["feasible"] else "never",
        ]
        for c in result["constraints"]
    ]
    lines.append(format_table(["link", "eq.", "P/D >=", "P/D <=", ""], rows, indent="  "))
    return lines


def _render_links(result: dict[str, Any]) -> str:
    verdict = "bottleneck-free" if result["bottleneck_free"] else "BOTTLENECKED"
    header = (
        f"traffic at P={result['num_prefill_nodes']} D={result['num_decode_nodes']} "
        f"(P/D = {result['pd_ratio']:.4g}): {verdict}"
    )
    rows = [
        [
            link["link"],
            link["scope"],
            link["steps"],
            units.format_rate(link["bytes_per_s"]),
            units.format_rate(link["capacity_bytes_per_s"]),
            f"{100 * link['utilisation']:.1f}%",
            "" if link["within_capacity"] else "OVER",
        ]
        for link in result["links"]
    ]
    st = result["storage"]
    rows.append(
        [
            "storage (all SNICs)",
            "cluster",
            "a1 b1",
            units.format_rate(st["bytes_per_s"]),
            units.format_rate(st["capacity_bytes_per_s"]),
            f"{100 * st['utilisation']:.1f}%",
            "" if st["within_capacity"] else "OVER",
        ]
    )
    return (
        header
        + "\n"
        + format_table(["link", "scope", "steps", "traffic", "capacity", "util.", ""], rows, indent="  ")
    )


def _render_ratio(result: dict[str, Any]) -> list[str]:
    kv = result["kv_bytes_per_token_per_layer"]
    lines = [
        f"KV cache: {kv:,.0f} B/token/layer, {units.format_bytes(result['kv_bytes_per_token'])}/token",
        f"cache-compute ratio (Table 1), append {result['append_tokens']} tokens:",
    ]
    rows = [
        [label, f"{result['context_tokens'][label]:,}", f"{value:.3g}"]
        for label, value in result["cache_compute_gb_per_pflop"].items()
    ]
    lines.append(format_table(["context", "tokens", "GB/PFLOP"], rows, indent="  "))
    return lines


def render_table1(result: dict[str, Any]) -> str:
    labels = list(result["context_tokens"])
    header = ["model", *labels, "paper 16K", "paper 64K", "dev 16K", "dev 64K"]
    rows = []
    for row in result["rows"]:
        ours = [f"{row['cache_compute_gb_per_pflop'][label]:.3g}" for label in labels]
        paper = row.get("paper_gb_per_pflop", {})
        dev = row.get("deviation", {})
        rows.append(
            [
                row["model"],
                *ours,
                *(f"{paper[k]:g}" if k in paper else "-" for k in ("16K", "64K")),
                *(f"{100 * dev[k]:+.1f}%" if k in dev else "-" for k in ("16K", "64K")),
            ]
        )
    tokens = ", ".join(f"{k}={v:,}" for k, v in result["context_tokens"].items())
    title = f"Table 1: cache-compute ratio in GB/PFLOP, append {result['append_tokens']} tokens ({tokens})"
    notes = [f"note {row['model']}: {row['note']}" for row in result["rows"] if "note" in row]
    return "\n".join([title, format_table(header, rows), *notes])


def format_table(header: list[str], rows: list[list[str]], *, indent: str = "") -> str:
    """Columns aligned: the first left-aligned, the rest right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return (indent + "  ".join(parts)).rstrip()

    rule = (indent + "  ".join("-" * w for w in widths)).rstrip()
    return "\n".join([line(header), rule, *map(line, rows)])
