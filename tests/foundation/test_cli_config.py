"""`dualpath config` end to end."""

from __future__ import annotations

import json

import pytest

from dualpath.cli.main import main


def test_config_list_names_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "list"]) == 0
    out = capsys.readouterr().out
    assert "hopper-8x400g" in out and "deepseek-v3.2" in out and "ds660b-2p4d" in out


def test_config_show_model_with_override_and_derived(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "deepseek-v3.2", "--set", "kv_includes_indexer=true"]) == 0
    out = capsys.readouterr().out
    assert "kv_bytes_per_token_per_layer = 788" in out
    assert "attention.sparse_top_k_tokens = 2048" in out


def test_config_show_hardware_prints_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "hopper-8x400g"]) == 0
    out = capsys.readouterr().out
    assert "cnic_bytes_per_s = 50 GB/s" in out
    assert "gpu.peak_bf16_flops_per_s = 989 TFLOPS" in out


def test_config_show_json_is_si_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "ds660b-2p4d", "--json", "--set", "num_decode_nodes=8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["hardware"]["snic_bytes_per_s"] == 50e9
    assert out["config"]["num_decode_nodes"] == 8


def test_config_show_unknown_preset_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "no-such-thing"]) == 2
    assert "no-such-thing" in capsys.readouterr().err


def test_config_show_unknown_override_key_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "h100", "--set", "gpu.tflops=1"]) == 2
    assert "gpu.tflops" in capsys.readouterr().err
