"""Load (and save) a Hugging Face Llama/Qwen2 checkpoint folder: `config.json` + `*.safetensors`.

Only a local folder is read; nothing is ever downloaded. The weights are one `model.safetensors`, or shards
listed by `model.safetensors.index.json` (or, without an index, every `*.safetensors` file). A missing
folder, file or tensor is an error that names it. Tensor names map one to one:

    model.embed_tokens.weight                          -> embed
    model.layers.N.input_layernorm.weight              -> layers[N].input_norm
    model.layers.N.self_attn.{q,k,v,o}_proj.weight     -> layers[N].{q,k,v,o}_w
    model.layers.N.self_attn.{q,k,v}_proj.bias         -> layers[N].{q,k,v}_b      (Qwen2)
    model.layers.N.post_attention_layernorm.weight     -> layers[N].post_norm
    model.layers.N.mlp.{gate,up,down}_proj.weight      -> layers[N].{gate,up,down}_w
    model.norm.weight                                  -> final_norm
    lm_head.weight                                     -> lm_head  (absent when tied)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dualpath.runtime.model.config import TransformerConfig, config_from_hf, config_to_hf
from dualpath.runtime.model.transformer import Transformer
from dualpath.runtime.model.weights import LayerWeights, ModelWeights

_LAYER_NAMES = {
    "input_norm": "input_layernorm.weight",
    "q_w": "self_attn.q_proj.weight",
    "k_w": "self_attn.k_proj.weight",
    "v_w": "self_attn.v_proj.weight",
    "o_w": "self_attn.o_proj.weight",
    "post_norm": "post_attention_layernorm.weight",
    "gate_w": "mlp.gate_proj.weight",
    "up_w": "mlp.up_proj.weight",
    "down_w": "mlp.down_proj.weight",
}
_BIAS_NAMES = {"q_b": "self_attn.q_proj.bias", "k_b": "self_attn.k_proj.bias", "v_b": "self_attn.v_proj.bias"}
# Buffers some exports carry that are recomputed here.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_hf_folder(folder: str | Path, *, dtype: str | None = None, device: str = "cpu") -> Transformer:
    """A `Transformer` with the folder's weights, cast to `dtype` (default: the folder's `torch_dtype`,
    float32 if it names none the runtime has) on `device`."""
    folder = Path(folder)
    hf = read_hf_config(folder)
    config = config_from_hf(hf, dtype=dtype or default_dtype(hf), device=device)
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        tensors.update(load_file(str(path), device="cpu"))
    return Transformer(config, _weights_from_tensors(config, tensors))


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """The folder's `config.json`; a missing folder or file is a FileNotFoundError naming the path."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such model folder (expected config.json and *.safetensors)")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: no such file (expected a Hugging Face model folder)")
    config = json.loads(config_path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object")
    return config


def default_dtype(hf: dict[str, Any]) -> str:
    """The folder's own weight dtype (`torch_dtype`, or `dtype` in newer exports) if the runtime has it."""
    named = hf.get("torch_dtype") or hf.get("dtype")
    return named if named in ("float32", "bfloat16", "float16") else "float32"


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files: those the index names, else every `*.safetensors`."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map", {})
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [path for path in files if not path.is_file()]
        if missing:
            raise FileNotFoundError(f"{missing[0]}: no such file (listed in {index_path.name})")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    return files


def save_hf_folder(model: Transformer, folder: str | Path, *, architecture: str = "LlamaForCausalLM") -> None:
    """Write `config.json` and `model.safetensors` that `load_hf_folder` reads back bit-exactly."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(config_to_hf(model.config, architecture=architecture), indent=2)
    )
    save_file(tensors_of(model), str(folder / "model.safetensors"))


def _weights_from_tensors(config: TransformerConfig, tensors: dict[str, torch.Tensor]) -> ModelWeights:
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        used.add(name)
        return tensors[name].to(device=config.device, dtype=config.torch_dtype)

    layers = []
    for index in range(config.num_layers):
        prefix = f"model.layers.{index}."
        fields = {field: take(prefix + name) for field, name in _LAYER_NAMES.items()}
        if config.qkv_bias:
            fields.update({field: take(prefix + name) for field, name in _BIAS_NAMES.items()})
        layers.append(LayerWeights(**fields))
    embed = take("model.embed_tokens.weight")
    lm_head = (
        embed if config.tie_word_embeddings and "lm_head.weight" not in tensors else take("lm_head.weight")
    )
    final_norm = take("model.norm.weight")
    unexpected = sorted(name for name in tensors if name not in used and not name.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        raise ValueError(f"checkpoint has tensors this architecture does not use: {unexpected[:5]}")
    return ModelWeights(embed=embed, layers=tuple(layers), final_norm=final_norm, lm_head=lm_head)


def tensors_of(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under their Hugging Face names, as contiguous CPU tensors (safetensors-ready)."""
    weights = model.weights
    tensors = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.final_norm}
    if not model.config.tie_word_embeddings:
        tensors["lm_head.weight"] = weights.lm_head
    for index, layer in enumerate(weights.layers):
        names = {**_LAYER_NAMES, **(_BIAS_NAMES if model.config.qkv_bias else {})}
        for field, name in names.items():
            tensors[f"model.layers.{index}.{name}"] = getattr(layer, field)
    # safetensors refuses shared storage (tied weights) and wants contiguous CPU tensors.
    return {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in tensors.items()}
