"""A `ModelSpec` from a local Hugging Face model folder's `config.json` (Llama, Qwen2, Mistral: dense GQA).

`dualpath plan --model DIR`, the simulator and the runtime then size KV (bytes per token, Full Blocks) from
the same numbers the served model has. Only `config.json` is read; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dualpath.config.coerce import ConfigError

# The runtime's weight/KV dtypes -> a ModelSpec's kv_cache_format and weight bytes per parameter.
_FORMATS = {"float32": ("fp32", 4), "bfloat16": ("bf16", 2), "float16": ("fp16", 2)}
_DEFAULT_MAX_POSITIONS = 32768  # Hugging Face's default when config.json names none (Qwen2)


def is_model_folder(name_or_path: str) -> bool:
    """Whether `name_or_path` names a folder (an existing directory, or a path with a separator)."""
    return Path(name_or_path).is_dir() or "/" in name_or_path


def hf_model_document(folder: str | Path, *, dtype: str | None = None) -> dict[str, Any]:
    """The model table (as a preset's TOML would give it) for a Hugging Face folder.

    `dtype` (float32, bfloat16, float16) is the served KV/weight type; default the folder's `torch_dtype`.
    """
    folder = Path(folder)
    config_path = folder / "config.json"
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such model folder (expected config.json and *.safetensors)")
    if not config_path.is_file():
        raise ConfigError(f"{config_path}: no such file (expected a Hugging Face model folder)")
    hf = json.loads(config_path.read_text())
    if not isinstance(hf, dict):
        raise ConfigError(f"{config_path}: expected a JSON object")
    dtype = dtype or str(hf.get("torch_dtype") or hf.get("dtype") or "float32")
    if dtype not in _FORMATS:
        dtype = "float32"
    kv_format, weight_bytes = _FORMATS[dtype]
    try:
        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        return {
            "name": folder.resolve().name,
            "num_layers": int(hf["num_hidden_layers"]),
            "hidden_size": hidden,
            "vocab_size": int(hf["vocab_size"]),
            "weight_bytes_per_param": weight_bytes,
            "kv_cache_format": kv_format,
            "max_context_tokens": int(hf.get("max_position_embeddings") or _DEFAULT_MAX_POSITIONS),
            "tied_embeddings": bool(hf.get("tie_word_embeddings", False)),
            "attention": {
                "kind": "gqa",
                "num_heads": num_heads,
                "num_kv_heads": int(hf.get("num_key_value_heads") or num_heads),
                "head_dim": int(hf.get("head_dim") or hidden // num_heads),
            },
            "ffn": {"intermediate_size": int(hf["intermediate_size"])},
        }
    except KeyError as error:
        raise ConfigError(f"{config_path}: missing key {error.args[0]!r}") from None
