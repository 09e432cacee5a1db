"""Hugging Face folders (written by the test itself, never downloaded) and tokenizers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dualpath.runtime.model import (
    ByteTokenizer,
    Transformer,
    TransformerConfig,
    load_hf_folder,
    load_tokenizer,
)
from dualpath.runtime.model.hf_folder import save_hf_folder


def make_config(**overrides: object) -> TransformerConfig:
    fields: dict[str, object] = dict(
        vocab_size=300,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("architecture", "overrides"),
    [
        ("LlamaForCausalLM", {"tie_word_embeddings": True}),
        ("LlamaForCausalLM", {"rope_theta": 500000.0, "rms_eps": 1e-6}),
        ("Qwen2ForCausalLM", {"qkv_bias": True}),
    ],
)
def test_loaded_folder_gives_the_in_memory_models_logits(
    tmp_path: Path, architecture: str, overrides: dict[str, object]
) -> None:
    model = Transformer.random(make_config(**overrides), seed=3)
    save_hf_folder(model, tmp_path, architecture=architecture)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "model.layers.1.self_attn.q_proj.weight" in names
    assert ("model.layers.0.self_attn.k_proj.bias" in names) == (architecture == "Qwen2ForCausalLM")
    assert ("lm_head.weight" in names) == (not model.config.tie_word_embeddings)
    loaded = load_hf_folder(tmp_path)
    assert loaded.config == model.config
    ids = [1, 50, 299, 7, 7, 3]
    assert torch.equal(
        loaded.prefill(ids, all_logits=True).logits, model.prefill(ids, all_logits=True).logits
    )


def test_sharded_checkpoint_and_rotary_buffers_load(tmp_path: Path) -> None:
    model = Transformer.random(make_config(), seed=0)
    save_hf_folder(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file(
        {n: tensors[n] for n in names[: len(names) // 2]}, str(tmp_path / "model-00001-of-00002.safetensors")
    )
    rest = {n: tensors[n] for n in names[len(names) // 2 :]}
    rest["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(rest, str(tmp_path / "model-00002-of-00002.safetensors"))
    assert torch.equal(load_hf_folder(tmp_path).prefill([4, 5]).logits, model.prefill([4, 5]).logits)


def test_missing_and_unexpected_tensors_are_named(tmp_path: Path) -> None:
    save_hf_folder(Transformer.random(make_config(), seed=0), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_folder(tmp_path)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(96, 64)
    tensors["model.layers.0.mlp.experts.0.weight"] = torch.zeros(2)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="experts"):
        load_hf_folder(tmp_path)


def test_unsupported_architecture_and_rope_scaling_are_clear_errors(tmp_path: Path) -> None:
    save_hf_folder(Transformer.random(make_config(), seed=0), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(ValueError, match="MixtralForCausalLM"):
        load_hf_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"type": "yarn"}}))
    with pytest.raises(ValueError, match="rope_scaling"):
        load_hf_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_folder(tmp_path / "nowhere")


def test_byte_tokenizer_round_trips_utf8_and_marks_specials() -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("héllo ✓")
    assert ids[0] == tokenizer.bos_id == 256 and all(0 <= i < 256 for i in ids[1:])
    assert tokenizer.decode([*ids, tokenizer.eos_id]) == "héllo ✓"
    assert tokenizer.vocab_size == 260
    assert isinstance(load_tokenizer(None), ByteTokenizer)


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is not None, reason="tokenizers is installed")
def test_tokenizer_json_without_the_tokenizers_package_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(RuntimeError, match="'tokenizers' package"):
        load_tokenizer(tmp_path)
