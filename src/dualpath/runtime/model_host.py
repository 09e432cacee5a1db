"""Building the node's model from a preset name or a Hugging Face model folder, and measuring its prefill
rate for β (paper A.4).

A cluster's `model` is a preset (`tiny-llama`: seeded random weights, the byte tokenizer) or a local model
folder (config.json, *.safetensors, tokenizer.json: `runtime.model.hf_folder`). Every node builds the same
model from it, and the scheduler its tokenizer; KV bytes per token follow from the model's config.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from dualpath.runtime.model.config import TransformerConfig, config_from_model_spec
from dualpath.runtime.model.hf_folder import load_hf_folder, read_hf_config, weight_files
from dualpath.runtime.model.tokenizer import Tokenizer, load_tokenizer
from dualpath.runtime.model.transformer import Transformer

_WARMUP_TOKENS = 256  # a prompt long enough that per-call overheads do not dominate the measured rate
_PAIR_REPEATS = 3  # pairs of forwards timed for the attention cost (its median)


def is_preset(model: str) -> bool:
    """Whether `model` names a packaged model preset (else it is a model folder path)."""
    from dualpath.config.loader import MODEL, preset_names

    return "/" not in model and model in preset_names(MODEL)


def resolve_model(model: str) -> str:
    """A preset name as is; a folder as an absolute path, checked now, so every node (whatever its working
    directory) loads the same files and a missing folder or file fails before any process starts."""
    if is_preset(model):
        return model
    folder = Path(model).expanduser().resolve()
    read_hf_config(folder)
    weight_files(folder)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{folder / 'tokenizer.json'}: no such file (a served model needs its tokenizer)"
        )
    return str(folder)


def served_model_name(model: str) -> str:
    """The id clients use: the preset's name, or the folder's name."""
    return model if is_preset(model) else Path(model).name


def build_model(name: str, *, device: str, seed: int, dtype: str = "") -> Transformer:
    """Every node builds the same model, so PE and DE compute with identical math: a preset's seeded
    random weights, or the folder's weights (`dtype` "" keeps the preset's KV format / the folder's)."""
    if not is_preset(name):
        return load_hf_folder(name, dtype=dtype or None, device=device)
    from dualpath.config.loader import load_model

    spec = load_model(name)
    config: TransformerConfig = config_from_model_spec(spec, device=device, dtype=dtype or None)
    return Transformer.random(config, seed=seed)


def model_tokenizer(name: str) -> Tokenizer:
    """The served model's tokenizer: the byte tokenizer for a preset, the folder's own otherwise."""
    return load_tokenizer(None if is_preset(name) else name)


def measure_prefill_tokens_per_s(model: Transformer) -> float:
    """β's rate: tokens this engine prefills per second, measured on a warm-up prompt (A.4 "profiled")."""
    ids = torch.arange(_WARMUP_TOKENS) % model.config.vocab_size
    model.prefill(ids)  # first call pays one-time allocations
    start = time.perf_counter()
    model.prefill(ids)
    return _WARMUP_TOKENS / max(time.perf_counter() - start, 1e-6)


def measure_attention_s_per_token_pair(model: Transformer) -> float:
    """The §6.4 predictor's cost per query-key pair (`policy.inputs.pairwise_attention_time`): extra
    seconds per (new × cached) token pair, the difference between a forward of `_WARMUP_TOKENS` new tokens
    over a long cached prefix and over none. The median of `_PAIR_REPEATS` pairs of forwards: the quota
    predictor is this term alone, and one pair of timings moved it by ±40 % between node starts."""
    cached_tokens = 3 * _WARMUP_TOKENS
    prefix = model.prefill(torch.arange(cached_tokens) % model.config.vocab_size).kv
    ids = torch.arange(_WARMUP_TOKENS) % model.config.vocab_size
    model.prefill(ids, prefix)  # warm
    extra_s = []
    for _ in range(_PAIR_REPEATS):
        start = time.perf_counter()
        model.prefill(ids)
        bare_s = time.perf_counter() - start
        start = time.perf_counter()
        model.prefill(ids, prefix)
        extra_s.append(time.perf_counter() - start - bare_s)
    return max(0.0, statistics.median(extra_s)) / (_WARMUP_TOKENS * cached_tokens)
