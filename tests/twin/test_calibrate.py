"""`dualpath calibrate`: the fit recovers known coefficients, the CLI writes a preset that loads back."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dualpath.cli.main import UserError, main
from dualpath.config.loader import load_model
from dualpath.config.toml_write import dumps
from dualpath.sim.cost import CostCoefficients, CostModel
from dualpath.twin import CalibrationError, load_calibration
from dualpath.twin.calibration_fit import (
    DecodePoint,
    PrefillPoint,
    decode_attention_curve,
    fit_cost_coefficients,
    fit_line,
    nnls,
)

TINY = load_model("tiny-llama")
GRID_PREFILL = [(c, n) for c in (0, 256, 1024, 2048) for n in (16, 64, 256, 1024)]
GRID_DECODE = [(b, c) for b in (1, 4, 16) for c in (64, 512, 2048)]


def make_truth() -> CostCoefficients:
    """Coefficients of the fitted kind (constant curves, one decode curve per batch), chosen by hand."""
    base = CostCoefficients(
        bf16_flops_per_s=2.0e10,
        linear_flops_per_s=5.0e10,
        fp8_flops_per_s=5.0e10,
        weight_read_bytes_per_s=3.0e10,
        layer_overhead_s=4.0e-4,
        step_overhead_s=1.5e-3,
    )
    surface = {
        b: decode_attention_curve(TINY, base.bf16_flops_per_s, per_sequence_s=a, seconds_per_flop=1 / r)
        for b, a, r in ((1, 4e-4, 1.5e9), (4, 4e-4, 1.2e9), (16, 4e-4, 1.0e9))
    }
    return replace(base, decode_attention=surface)


def test_nnls_matches_exact_solution_and_clamps_negative_coefficients() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, (30, 3))
    x_true = np.array([2.0, 0.5, 3.0])
    assert np.allclose(nnls(a, a @ x_true), x_true, rtol=1e-9)
    # b built with a negative weight on column 1: the constrained optimum keeps it at exactly 0.
    x = nnls(a, a @ np.array([1.0, -2.0, 1.0]))
    assert x[1] == 0.0 and (x >= 0).all()


def test_line_fit_recovers_rate_and_fixed_time() -> None:
    sizes = [16384, 65536, 1 << 20] * 3
    times = [2e-4 + s / 6e6 for s in sizes]
    times[0] *= 5  # one late wake-up: the per-size median ignores it
    fit = fit_line(sizes, times)
    assert fit.rate_per_s == pytest.approx(6e6, rel=1e-9)
    assert fit.fixed_s == pytest.approx(2e-4, rel=1e-6)
    assert fit.quality.max_rel_error < 1e-9


def test_fit_recovers_known_coefficients_from_the_cost_models_own_forms() -> None:
    truth = make_truth()
    cost = CostModel(TINY, truth)
    prefill = [
        PrefillPoint(cached_tokens=c, new_tokens=n, time_s=cost.prefill_layer_time_s([[(c, n)]]))
        for c, n in GRID_PREFILL
    ]
    decode = [
        DecodePoint(batch_size=b, context_tokens=c, time_s=cost.decode_step_time_s(b, b * c))
        for b, c in GRID_DECODE
    ]
    fitted, report, parameters = fit_cost_coefficients(
        TINY, prefill, decode, weight_read_bytes_per_s=truth.weight_read_bytes_per_s
    )
    assert fitted.bf16_flops_per_s == pytest.approx(truth.bf16_flops_per_s, rel=1e-6)
    assert fitted.linear_flops_per_s == pytest.approx(truth.linear_flops_per_s, rel=1e-6)
    assert fitted.layer_overhead_s == pytest.approx(truth.layer_overhead_s, rel=1e-6)
    assert fitted.step_overhead_s == pytest.approx(truth.step_overhead_s, rel=1e-4)
    assert parameters["decode_attention_per_sequence_s"] == pytest.approx(4e-4, rel=1e-4)
    assert parameters["decode_b16_attention_flops_per_s"] == pytest.approx(1.0e9, rel=1e-4)
    assert report["prefill_layer"].max_rel_error < 1e-6
    assert report["decode_step"].max_rel_error < 1e-4


def test_prefill_fit_honours_the_weight_read_floor() -> None:
    # A slow weight read makes the floor bind on small prefills: a fit that ignored the max() would not
    # reproduce those points.
    truth = replace(make_truth(), weight_read_bytes_per_s=2.0e9)
    cost = CostModel(TINY, truth)
    prefill = [
        PrefillPoint(cached_tokens=c, new_tokens=n, time_s=cost.prefill_layer_time_s([[(c, n)]]))
        for c, n in GRID_PREFILL
    ]
    fitted, report, _ = fit_cost_coefficients(TINY, prefill, [], weight_read_bytes_per_s=2.0e9)
    assert fitted.linear_flops_per_s == pytest.approx(truth.linear_flops_per_s, rel=1e-6)
    assert report["prefill_layer"].max_rel_error < 1e-6


def test_toml_writer_round_trips_tables_curves_and_quoted_keys() -> None:
    import tomllib

    doc = {"cost": make_truth().to_dict(), "meta": {"machine": 'a "b"', "quick": True, "n": np.int64(3)}}
    back = tomllib.loads(dumps(doc, header="h", comments={"meta.quick": "why"}))
    assert CostCoefficients.from_dict(back["cost"]) == make_truth()
    assert back["meta"] == {"machine": 'a "b"', "quick": True, "n": 3}


@pytest.fixture(scope="module")
def quick_preset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cal") / "cpu.toml"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["calibrate", "--quick", "--quiet", "--json", "-o", str(out)]) == 0
    return out, json.loads(buffer.getvalue())


def test_calibrate_quick_writes_a_preset_that_loads_back(quick_preset: tuple[Path, dict]) -> None:
    path, printed = quick_preset
    calibration = load_calibration(path)
    assert calibration.model.name == "tiny-llama"
    assert calibration.hardware.gpus_per_node == 1
    assert calibration.hardware.dram_buffer_bytes == 256 * 2**20  # from local-1p2d
    # The emulated links run at their configured rates (6 MB/s SNIC, 48 MB/s CNIC) within a few percent.
    assert calibration.hardware.snic_bytes_per_s == pytest.approx(6e6, rel=0.1)
    assert calibration.hardware.cnic_bytes_per_s == pytest.approx(48e6, rel=0.1)
    assert calibration.meta["torch_threads"] == 1 and calibration.meta["quick"] is True
    assert set(printed["fit"]) >= {
        "prefill_layer",
        "decode_step",
        "snic",
        "cnic",
        "store_read",
        "store_write",
    }
    assert printed["fit"]["prefill_layer"]["points"] == len(GRID_PREFILL)


def test_calibrate_measures_the_runtime_in_situ_per_mode(quick_preset: tuple[Path, dict]) -> None:
    calibration = load_calibration(quick_preset[0])
    assert set(calibration.runtime_cpu) == {"basic", "dualpath", "oracle"}
    for mode, f in calibration.runtime_cpu.items():
        stored = calibration.measurements["runtime_cpu"][mode]
        measured, charged = stored["measured_cpu_s"], stored["charged_cpu_s"]
        # Every group of threads was found on the training replay: engines by their OS thread names.
        assert measured["pe_engine"] > 0 and measured["de_engine"] > 0 and measured["serve"] > 0, mode
        assert measured["client"] > 0 and measured["wall_s"] > 0, mode
        assert measured["prefill_tokens_per_s"] > 0, mode  # the run's scheduler constants
        # The engines counted their pieces (EngineWork via /metrics): the factor takes the CPU inside them.
        for group in ("pe_engine", "de_engine"):
            busy_cpu_s = measured[f"{group}_busy_cpu_s"]
            assert 0 < busy_cpu_s <= measured[group] * 1.05 and measured[f"{group}_wall_s"] >= busy_cpu_s, (
                mode
            )
            # Measured ÷ charged, then stepped in the fixed point: the factor the twin's last replays ran
            # with, times the runtime's CPU in the pieces ÷ the twin's.
            twin = stored["twin_engine_s"]
            assert twin[group] > 0 and charged[group] > 0, mode
            assert f[group] == pytest.approx(twin[group] * busy_cpu_s / twin[f"{group}_busy_cpu_s"]), mode
        assert f["background_cores"] > 0.0, mode
        # The DE efficiency's and the PE stall's fixed point ran on the twin's pieces of the same replays.
        assert stored["twin_engine_s"]["pe_engine_busy_cpu_s"] > 0, mode
        assert stored["twin_engine_s"]["pe_engine_pieces"] > 0, mode
        assert 0.25 <= f["de_efficiency"] <= 1.0 and 0.0 <= f["pe_stall_s"] < 1.0, mode
    # Oracle decodes continuing batches: the DEs counted their restarts.
    assert calibration.measurements["runtime_cpu"]["oracle"]["measured_cpu_s"]["decode_restarts"] > 0
    assert 0.0 < calibration.runtime_cpu["oracle"]["decode_restart_s"] < 1.0


def test_loaded_cost_model_predicts_measured_prefill_points_within_reported_error(
    quick_preset: tuple[Path, dict],
) -> None:
    calibration = load_calibration(quick_preset[0])
    m = calibration.measurements["prefill_layer"]
    reported = calibration.fit_report["prefill_layer"]
    errors = [
        abs(calibration.cost_model.prefill_layer_time_s([[(c, n)]]) - t) / t
        for c, n, t in zip(m["cached_tokens"], m["new_tokens"], m["time_s"], strict=True)
    ]
    assert len(errors) == reported.points
    assert max(errors) <= reported.max_rel_error * (1 + 1e-9)
    assert sum(errors) / len(errors) == pytest.approx(reported.mean_rel_error, rel=1e-9)


def test_bad_config_path_is_a_user_error(tmp_path: Path) -> None:
    from dualpath.cli.cmd_calibrate import run
    from dualpath.cli.main import build_parser

    args = build_parser().parse_args(
        ["calibrate", "--config", str(tmp_path / "nope.toml"), "-o", str(tmp_path / "x.toml")]
    )
    with pytest.raises(UserError, match="nope.toml"):
        run(args)
    assert main(["calibrate", "--config", "no-such-preset", "-o", str(tmp_path / "x.toml")]) == 2


def test_load_calibration_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="no calibration file"):
        load_calibration(tmp_path / "missing.toml")
    partial = tmp_path / "partial.toml"
    partial.write_text('[model]\npreset = "tiny-llama"\n')
    with pytest.raises(CalibrationError, match="missing section"):
        load_calibration(partial)
