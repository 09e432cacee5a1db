"""Planner oracles: the paper's worked example, the traffic table, Table 1, and the CLI end to end."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import pytest

from dualpath.cli.main import main
from dualpath.config.loader import load_hardware, load_model
from dualpath.config.specs import HardwareSpec
from dualpath.plan.bounds import pd_range
from dualpath.plan.ratio import (
    TABLE1_CONTEXTS,
    cache_compute_ratio_gb_per_pflop,
    kv_working_set,
)
from dualpath.plan.traffic import link_loads


def paper_node(**changes: object) -> HardwareSpec:
    """The §4.2 worked example: g = 8, s = 1, sB = B = 50 GB/s, M = 500 GB/s."""
    return dataclasses.replace(load_hardware("hopper-8x400g"), **changes)  # type: ignore[arg-type]


def test_worked_example_is_exactly_one_seventh_to_seven_halves() -> None:
    rng = pd_range(paper_node())
    assert rng.pd_ratio_min == Fraction(1, 7)
    assert rng.pd_ratio_max == Fraction(7, 2)
    assert set(rng.binding_upper) == {"DE CNIC write", "DE DRAM"}
    assert rng.binding_lower == ("PE CNIC write",)


def test_traffic_matches_the_paper_closed_forms_for_any_g_s_m() -> None:
    # §4.2 table, as functions of r = P/D, for a node with g = 4, s = 0.5, M = 300 GB/s.
    hw = paper_node(gpus_per_node=4, snic_bytes_per_s=25e9, dram_bytes_per_s=300e9)
    g, sb, p, d = 4, Fraction(25 * 10**9), 3, 2
    r = Fraction(p, d)
    expected = {
        "pe_cnic_read": 2 * sb / g,
        "pe_cnic_write": sb / g * (1 + 1 / r),
        "de_cnic_read": sb / g * (r + 2),
        "de_cnic_write": sb / g * (2 * r + 1),
        "pe_dram": 2 * sb,
        "de_dram": (3 + 2 * r) * sb,
    }
    got = {load.link_id: load.bytes_per_s(p, d) for load in link_loads(hw)}
    for link_id, value in expected.items():
        assert got[link_id] == value, link_id


def test_general_bounds_match_equation_9() -> None:
    g, s, m_over_b = 8, Fraction(1, 2), Fraction(12)
    hw = paper_node(snic_bytes_per_s=25e9, dram_bytes_per_s=600e9)
    rng = pd_range(hw)
    assert rng.pd_ratio_min == s / (g - s)
    assert rng.pd_ratio_max == min((g - 2 * s) / s, (g - s) / (2 * s), (m_over_b / s - 3) / 2)


def test_eq1_needs_s_at_most_half_g() -> None:
    # s = 5 > g/2 = 4: the PE CNIC read (2sB/g ≤ B) fails for every P/D (paper summary §5 note).
    rng = pd_range(paper_node(snic_bytes_per_s=250e9, dram_bytes_per_s=10e12))
    assert rng.is_empty
    assert "PE CNIC read" in rng.infeasible_links


@pytest.mark.parametrize(
    ("p", "d", "free"), [(1, 7, True), (1, 8, False), (7, 2, True), (4, 1, False), (2, 4, True)]
)
def test_layouts_just_outside_the_range_are_bottlenecked(p: int, d: int, free: bool) -> None:
    assert pd_range(paper_node()).contains(p, d) is free


def test_faster_dram_moves_the_binding_constraint() -> None:
    rng = pd_range(paper_node(dram_bytes_per_s=1e12))
    assert rng.binding_upper == ("DE CNIC write",)
    assert rng.pd_ratio_max == Fraction(7, 2)


@pytest.mark.parametrize(
    ("model", "paper_16k", "paper_64k"), [("qwen2.5-32b", 117, 267), ("deepseek-v3.2", 13, 36)]
)
def test_table1_rows_within_ten_percent(model: str, paper_16k: float, paper_64k: float) -> None:
    m = load_model(model)
    assert cache_compute_ratio_gb_per_pflop(m, TABLE1_CONTEXTS["16K"], 429) == pytest.approx(
        paper_16k, rel=0.10
    )
    assert cache_compute_ratio_gb_per_pflop(m, TABLE1_CONTEXTS["64K"], 429) == pytest.approx(
        paper_64k, rel=0.10
    )


def test_deepseek_v32_ratio_on_the_trace_is_about_22() -> None:
    # Paper §3: DeepSeek-V3.2 measures ≈22 GB/PFLOP on the trace (32.7K context, 429 append).
    ratio = cache_compute_ratio_gb_per_pflop(load_model("deepseek-v3.2"), 32_721, 429)
    assert ratio == pytest.approx(22, rel=0.05)


def test_working_set_is_half_of_little_law_tokens() -> None:
    m = load_model("qwen2.5-32b")
    ws = kv_working_set(m, agents_per_s=2.0, mean_jct_s=100.0, mean_total_tokens=1000.0)
    assert ws.tokens == 100_000
    assert ws.kv_bytes == 100_000 * 256 * 1024


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_cli_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--hardware", "hopper-8x400g", "--model", "deepseek-v3.2", "--p", "2", "--d", "4")
    assert out["pd_ratio_min"] == pytest.approx(1 / 7)
    assert out["pd_ratio_max"] == pytest.approx(3.5)
    assert set(out["binding_constraint"]) == {"DE CNIC write", "DE DRAM"}  # type: ignore[arg-type]
    assert out["bottleneck_free"] is True
    links = {link["link_id"]: link for link in out["links"]}  # type: ignore[attr-defined]
    assert links["de_dram"]["bytes_per_s"] == pytest.approx((3 + 2 * 0.5) * 50e9)
    assert links["de_dram"]["utilisation"] == pytest.approx(0.4)
    ratios = out["cache_compute_gb_per_pflop"]
    assert set(ratios) >= {"16K", "32K", "48K", "64K"}  # type: ignore[arg-type]
    assert ratios["16K"] == pytest.approx(13, rel=0.10)  # type: ignore[index]


def test_cli_flags_a_bottlenecked_layout(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--p", "4", "--d", "1")
    assert out["bottleneck_free"] is False
    over = {link["link"] for link in out["links"] if not link["within_capacity"]}  # type: ignore[attr-defined]
    assert over == {"DE CNIC write", "DE DRAM"}  # r = 4: (2r+1)/8 = 9/8 of B, (3+2r)sB = 550 GB/s


def test_cli_extra_context_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--context-tokens", "32721", "--set", "hardware.dram_bytes_per_s=1TB/s")
    assert "32721" in out["cache_compute_gb_per_pflop"]  # type: ignore[operator]
    assert out["binding_constraint"] == ["DE CNIC write"]


def test_cli_table1_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--table1")
    rows = {row["model"]: row for row in out["rows"]}  # type: ignore[attr-defined]
    assert {"qwen2.5-32b", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v3.2", "deepseek-v3"} <= set(rows)
    for name in ("qwen2.5-32b", "deepseek-v3.2"):
        assert all(abs(dev) <= 0.10 for dev in rows[name]["deviation"].values())
    assert "note" in rows["deepseek-v3"]  # off by > 10 %: explained, not tuned


def test_cli_text_output_has_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--p", "2", "--d", "4"]) == 0
    text = capsys.readouterr().out
    assert "1/7 <= P/D <= 7/2" in text
    assert "GB/s" in text and "GB/PFLOP" in text


def test_cli_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--set", "hardware.snic_bytes_per_s=fast"]) == 2
    err = capsys.readouterr().err
    assert "hardware.snic_bytes_per_s = 'fast'" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "--p", "0"]) == 2
