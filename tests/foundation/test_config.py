"""Presets load, validate, override; bad keys and values are errors that say what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath.architecture import arch
from dualpath.config import loader
from dualpath.config.coerce import ConfigError


@pytest.mark.parametrize("name", loader.preset_names(loader.HARDWARE))
def test_every_hardware_preset_loads(name: str) -> None:
    spec = loader.load_hardware(name)
    assert spec.cnic_bytes_per_s > 0 and spec.gpu.peak_fp8_flops_per_s > spec.gpu.peak_bf16_flops_per_s


@pytest.mark.parametrize("name", loader.preset_names(loader.MODEL))
def test_every_model_preset_loads(name: str) -> None:
    spec = loader.load_model(name)
    assert spec.name == name
    assert arch.kv_bytes_per_token(spec) > 0


@pytest.mark.parametrize("name", loader.preset_names(loader.PD_CLUSTER))
def test_every_cluster_preset_loads(name: str) -> None:
    assert loader.load_cluster(name).name == name


def test_expected_presets_exist() -> None:
    assert {"hopper-8x400g", "h800", "h100", "h200", "gb200-nvl72"} <= set(loader.preset_names("hardware"))
    models = {"deepseek-v3.2", "deepseek-v3", "ds-27b", "qwen2.5-32b", "gpt-oss-120b", "qwen3-235b-a22b"}
    assert models | {"tiny-llama", "tiny-llama-wide"} <= set(loader.preset_names("model"))


def test_paper_node_is_parsed_into_si_units() -> None:
    h = loader.load_hardware("hopper-8x400g")
    assert h.gpus_per_node == 8
    assert h.cnic_bytes_per_s == pytest.approx(50e9)
    assert h.snic_bytes_per_s == pytest.approx(50e9)
    assert h.dram_bytes_per_s == pytest.approx(500e9)
    assert h.gpu.peak_bf16_flops_per_s == pytest.approx(989e12)
    assert h.gpu.hbm_bytes_per_s == pytest.approx(3.35e12)
    # 3FS aggregate must not bind for 144 nodes (48P96D) each saturating a 400 Gbps SNIC.
    assert h.storage_bytes_per_s >= 144 * h.snic_bytes_per_s


def test_gpu_variants_extend_the_paper_node() -> None:
    h200 = loader.load_hardware("h200")
    assert h200.gpu.hbm_bytes == pytest.approx(141e9)
    assert h200.cnic_bytes_per_s == loader.load_hardware("hopper-8x400g").cnic_bytes_per_s


def test_deepseek_v32_preset_matches_public_config() -> None:
    m = loader.load_model("deepseek-v3.2")
    assert arch.kv_bytes_per_token_per_layer(m) == 656
    assert m.attention.sparse_top_k_tokens == 2048
    assert m.ffn.num_dense_layers == 3


def test_qwen_cluster_gets_the_larger_buffer() -> None:
    c = loader.load_cluster("qwen32b-1p2d")
    assert c.hardware.dram_buffer_bytes == pytest.approx(320e9)
    assert (c.num_prefill_nodes, c.num_decode_nodes) == (1, 2)
    assert c.model.name == "qwen2.5-32b"


def test_cli_style_arguments_win_over_the_document() -> None:
    c = loader.load_cluster("ds660b-2p4d", num_prefill_nodes=3, num_decode_nodes=5, model="ds-27b")
    assert (c.num_prefill_nodes, c.num_decode_nodes, c.model.name) == (3, 5, "ds-27b")


def test_overrides_parse_units_by_field_name() -> None:
    c = loader.load_cluster(
        hardware="hopper-8x400g",
        model="deepseek-v3.2",
        overrides=[
            "hardware.snic_bytes_per_s=200Gbps",
            "scheduler.compute_quota_s=150ms",
            "num_decode_nodes=4",
        ],
    )
    assert c.hardware.snic_bytes_per_s == pytest.approx(25e9)
    assert c.scheduler.compute_quota_s == pytest.approx(0.15)
    assert c.num_decode_nodes == 4


def test_override_nested_model_field() -> None:
    m = loader.load_model("deepseek-v3.2", ["attention.sparse_top_k_tokens=1Ki", "kv_includes_indexer=true"])
    assert m.attention.sparse_top_k_tokens == 1024
    assert arch.kv_bytes_per_token_per_layer(m) == 788


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("hardware.snic_gbps=400", ["hardware.snic_gbps", "snic_bytes_per_s"]),
        ("hardware.snic_bytes_per_s=400Gbs", ["hardware.snic_bytes_per_s", "400Gbs", "400Gbps"]),
        ("hardware.gpus_per_node=eight", ["hardware.gpus_per_node", "eight", "whole number"]),
        ("hardware.cnic_bytes_per_s=0", ["hardware.cnic_bytes_per_s", "> 0"]),
        ("num_prefill_nodes", ["KEY=VALUE"]),
        ("hardware=h200", ["names a table"]),
    ],
)
def test_bad_overrides_name_key_value_and_expectation(override: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        loader.load_cluster(overrides=[override])
    for fragment in fragments:
        assert fragment in str(error.value)


def test_unknown_key_in_a_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('extends = "hopper-8x400g"\nsnic_gbps = 400\n')
    with pytest.raises(ConfigError, match="unknown key 'snic_gbps'"):
        loader.load_hardware(str(path))


def test_bad_unit_in_a_file_names_the_nested_key(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('extends = "hopper-8x400g"\n[gpu]\nhbm_bytes = "80 gigs"\n')
    with pytest.raises(ConfigError, match=r"gpu\.hbm_bytes = '80 gigs'.*80GiB"):
        loader.load_hardware(str(path))


def test_file_can_extend_a_preset_and_validation_runs(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('extends = "qwen2.5-32b"\nname = "x"\n[attention]\nnum_kv_heads = 7\n')
    with pytest.raises(ConfigError, match="num_kv_heads = 7: expected a divisor of num_heads"):
        loader.load_model(str(path))


def test_unknown_preset_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown model preset 'gpt-5'.*qwen2.5-32b"):
        loader.load_model("gpt-5")


def test_extends_cycle_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        loader.load_hardware(str(tmp_path / "a.toml"))


def test_specs_are_frozen() -> None:
    h = loader.load_hardware()
    with pytest.raises(AttributeError):
        h.gpus_per_node = 4  # type: ignore[misc]
