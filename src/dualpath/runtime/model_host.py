"""Building the node's model from a preset name, and measuring its prefill rate for β (paper A.4)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from dualpath.runtime.model.config import TransformerConfig, config_from_model_spec
from dualpath.runtime.model.transformer import Transformer

_WARMUP_TOKENS = 256  # a prompt long enough that per-call overheads do not dominate the measured rate
_REPEATS = 3  # the median of three: one slice lost to a neighbour does not set the rate


def build_model(name: str, *, device: str, seed: int) -> Transformer:
    """Every node builds the same seeded weights, so PE and DE compute with identical math."""
    from dualpath.config.loader import load_model

    spec = load_model(name)
    config: TransformerConfig = config_from_model_spec(spec, device=device)
    return Transformer.random(config, seed=seed)


def _engine_seconds(fn: Callable[[], object], repeats: int = _REPEATS) -> float:
    """Median over `repeats` of the engine's own time for `fn()`: the calling thread's CPU time when torch
    computes on this one thread (a node's engine), else wall time.

    A node measures at start-up, while the other nodes start beside it on the same cores: wall time then
    read 2,770-8,833 tokens/s across runs of the same cluster, and β and the §6.4 quota moved with it. An
    engine's speed is its own (a GPU's does not depend on its neighbours); CPU time measures that.
    """
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    return max(statistics.median(samples), 1e-6)


def measure_prefill_tokens_per_s(model: Transformer) -> float:
    """β's rate: tokens this engine prefills per second, measured on a warm-up prompt (A.4 "profiled")."""
    ids = torch.arange(_WARMUP_TOKENS) % model.config.vocab_size
    model.prefill(ids)  # first call pays one-time allocations
    return _WARMUP_TOKENS / _engine_seconds(lambda: model.prefill(ids))


def measure_attention_s_per_token_pair(model: Transformer) -> float:
    """The §6.4 predictor's quadratic term: extra seconds per (new × cached) token pair, measured as the
    difference between a forward of `_WARMUP_TOKENS` new tokens over a long cached prefix and over none."""
    cached_tokens = 3 * _WARMUP_TOKENS
    prefix = model.prefill(torch.arange(cached_tokens) % model.config.vocab_size).kv
    ids = torch.arange(_WARMUP_TOKENS) % model.config.vocab_size
    model.prefill(ids, prefix)  # warm
    bare_s = _engine_seconds(lambda: model.prefill(ids))
    over_prefix_s = _engine_seconds(lambda: model.prefill(ids, prefix))
    return max(0.0, over_prefix_s - bare_s) / (_WARMUP_TOKENS * cached_tokens)
