"""`dualpath sweep`: spec parsing and errors, expansion into runs, outputs, and the per-run cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath.cli.main import main
from dualpath.experiments.sweep import SweepError, load_sweep, parse_sweep, shipped_specs

TINY = """
name = "tiny"
metrics = ["jct_s", "ttft_s.p90", "tpot_s.mean"]
[base]
model = "ds-27b"
layout = "1P1D"
dataset = "32k"
[grid]
mode = ["basic", "dualpath"]
agents = [2, 4]
"""


def parse(text: str, **kwargs):  # type: ignore[no-untyped-def]
    import tomllib

    return parse_sweep(tomllib.loads(text), where="spec.toml", folder=Path("."), **kwargs)


def test_grid_crossed_with_runs_expands_every_combination() -> None:
    sweep = parse(
        TINY + '[[runs]]\nseed = 1\n[[runs]]\nseed = 2\n"set.hardware.snic_bytes_per_s" = "200Gbps"\n',
        extra_sets=["workload.gen_scale=0.5"],
    )
    assert len(sweep.runs) == 2 * 2 * 2
    assert sweep.axes == ("mode", "agents", "seed", "set.hardware.snic_bytes_per_s")
    assert sweep.x == "agents"  # the first axis that is not the mode
    last = sweep.runs[-1].spec
    assert (last.seed, last.mode, last.agents, last.p, last.d) == (2, "dualpath", 4, 1, 1)
    assert last.overrides == ("hardware.snic_bytes_per_s=200Gbps", "workload.gen_scale=0.5")
    assert len({r.spec.key() for r in sweep.runs}) == 8


def test_online_runs_take_their_agent_count_from_aps_and_duration() -> None:
    sweep = parse(
        '[base]\nmodel = "ds-27b"\np = 1\nd = 2\nmode = "basic"\nduration_s = 100\n[grid]\naps = [0.5, 2]'
    )
    assert [(r.spec.aps, r.spec.agents, r.spec.duration_s) for r in sweep.runs] == [
        (0.5, 50, 100.0),
        (2.0, 200, 100.0),
    ]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('[base]\nmodle = "x"', "base.modle"),
        ('[grid]\np = ["one"]', "grid.p"),
        ('[base]\nlayout = "2x4"', "base.layout"),
        ("[grid]\naps = 3", "grid.aps"),
        ("colour = 1", "colour"),
        ('[base]\nmodel = "ds-27b"\nlayout = "1P1D"\nmode = "basic"\naps = 1.0', "duration_s"),
        ('[base]\nmodel = "ds-27b"\nlayout = "1P1D"\nmode = "fast"', "mode"),
        ('[base]\nmodel = "ds-27b"\nlayout = "1P1D"', "'mode'"),
        ('x = "aps"\n[base]\nmodel = "ds-27b"\nlayout = "1P1D"\nmode = "basic"', "x = 'aps'"),
        ('[base]\nmodel = "ds-27b"\nlayout = "1P1D"\nmode = "basic"\ntrace = "nope.jsonl"', "trace"),
    ],
)
def test_a_bad_spec_names_the_key(text: str, names: str) -> None:
    with pytest.raises(SweepError, match=names.replace("(", r"\(").replace(".", r"\.")):
        parse(text)


def test_sweep_cli_writes_outputs_and_resumes_from_the_cache(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "-o", str(out), "--workers", "2", "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["values"] for r in results["runs"]] == [
        {"mode": m, "agents": n} for m in ("basic", "dualpath") for n in (2, 4)
    ]
    for r in results["runs"]:
        assert r["ok"] and r["metrics"]["jct_s"] == r["result"]["jct_s"] > 0
        assert (
            "sim_wall_s" not in r["result"]
        )  # wall clock lives in timings.json: results.json is reproducible
        assert json.loads((out / "runs" / f"{r['key']}.json").read_text())["jct_s"] == r["metrics"]["jct_s"]
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "jct-s-vs-agents.png",
        "tpot-s-mean-vs-agents.png",
        "ttft-s-p90-vs-agents.png",
    ]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "<td>dualpath</td>" in html
    assert len((out / "table.csv").read_text().splitlines()) == 5
    # A second invocation runs nothing: every result comes from the cache (a corrupted run would show).
    stamp = {p: p.stat().st_mtime_ns for p in (out / "runs").iterdir()}
    capsys.readouterr()
    assert main(["sweep", str(spec), "-o", str(out), "--quiet"]) == 0
    assert "(4 from the cache" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").iterdir()} == stamp
    assert json.loads((out / "results.json").read_text()) == results


def test_sweep_cli_reports_a_bad_spec_as_a_user_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "bad.toml"
    spec.write_text('[grid]\nagents = ["many"]\n')
    assert main(["sweep", str(spec)]) == 2
    assert "grid.agents must be an integer" in capsys.readouterr().err


def test_shipped_specs_parse() -> None:
    for name, path in shipped_specs().items():
        sweep = load_sweep(path)
        assert sweep.runs, name


@pytest.mark.parametrize("figure", ["fig7", "fig8", "fig9", "fig10"])
def test_shipped_paper_specs_are_reproduces_quick_runs(figure: str) -> None:
    # Same RunSpecs, so `dualpath sweep paper-figN-quick` and `reproduce figN --quick` share cached runs.
    from dualpath.experiments.scenarios import EXPERIMENTS

    sweep = load_sweep(shipped_specs()[f"paper-{figure}-quick"])
    assert set(sweep.specs()) == set(EXPERIMENTS[figure].specs(True))
