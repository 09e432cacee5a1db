"""Building the node's model from a preset name, and measuring its prefill rate for β (paper A.4)."""

from __future__ import annotations

import time

import torch

from dualpath.runtime.model.config import TransformerConfig, config_from_model_spec
from dualpath.runtime.model.transformer import Transformer

_WARMUP_TOKENS = 256  # a prompt long enough that per-call overheads do not dominate the measured rate


def build_model(name: str, *, device: str, seed: int) -> Transformer:
    """Every node builds the same seeded weights, so PE and DE compute with identical math."""
    from dualpath.config.loader import load_model

    spec = load_model(name)
    config: TransformerConfig = config_from_model_spec(spec, device=device)
    return Transformer.random(config, seed=seed)


def measure_prefill_tokens_per_s(model: Transformer) -> float:
    """β's rate: tokens this engine prefills per second, measured on a warm-up prompt (A.4 "profiled")."""
    ids = torch.arange(_WARMUP_TOKENS) % model.config.vocab_size
    model.prefill(ids)  # first call pays one-time allocations
    start = time.perf_counter()
    model.prefill(ids)
    return _WARMUP_TOKENS / max(time.perf_counter() - start, 1e-6)


def measure_attention_s_per_token_pair(model: Transformer) -> float:
    """The §6.4 predictor's quadratic term: extra seconds per (new × cached) token pair, measured as the
    difference between a forward of `_WARMUP_TOKENS` new tokens over a long cached prefix and over none."""
    cached_tokens = 3 * _WARMUP_TOKENS
    prefix = model.prefill(torch.arange(cached_tokens) % model.config.vocab_size).kv
    ids = torch.arange(_WARMUP_TOKENS) % model.config.vocab_size
    model.prefill(ids, prefix)  # warm
    start = time.perf_counter()
    model.prefill(ids)
    bare_s = time.perf_counter() - start
    start = time.perf_counter()
    model.prefill(ids, prefix)
    over_prefix_s = time.perf_counter() - start
    return max(0.0, over_prefix_s - bare_s) / (_WARMUP_TOKENS * cached_tokens)
