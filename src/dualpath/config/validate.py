"""Checks a spec makes physical sense; every failure names the field, its value and what is expected.

Specs are plain frozen dataclasses (tests build odd ones on purpose); the loader calls `validate`
on everything it builds from a file or an override.
"""

from __future__ import annotations

from dualpath.config.coerce import ConfigError
from dualpath.config.specs import (
    AttentionSpec,
    ClusterSpec,
    FfnSpec,
    GpuSpec,
    HardwareSpec,
    ModelSpec,
    SchedulerSpec,
)

KV_CACHE_FORMATS = ("fp32", "bf16", "fp16", "fp8", "mla-fp8")
ATTENTION_KINDS = ("gqa", "mla")

Spec = GpuSpec | HardwareSpec | AttentionSpec | FfnSpec | ModelSpec | SchedulerSpec | ClusterSpec


def validate(spec: Spec, path: str = "") -> None:
    """Raise `ConfigError` on the first field that makes no sense."""
    checks = {
        GpuSpec: _gpu,
        HardwareSpec: _hardware,
        AttentionSpec: _attention,
        FfnSpec: _ffn,
        ModelSpec: _model,
        SchedulerSpec: _scheduler,
        ClusterSpec: _cluster,
    }
    checks[type(spec)](spec, path)  # type: ignore[operator]


def _gpu(g: GpuSpec, path: str) -> None:
    _positive(g, path, "peak_bf16_flops_per_s", "peak_fp8_flops_per_s", "hbm_bytes", "hbm_bytes_per_s")


def _hardware(h: HardwareSpec, path: str) -> None:
    _gpu(h.gpu, _join(path, "gpu"))
    _positive(
        h,
        path,
        "gpus_per_node",
        "cnic_bytes_per_s",
        "snic_bytes_per_s",
        "dram_bytes_per_s",
        "pcie_bytes_per_s",
        "dram_buffer_bytes",
        "storage_bytes_per_s",
    )
    if not 0 < h.high_priority_share <= 1:
        _fail(path, "high_priority_share", h.high_priority_share, "a fraction in (0, 1], e.g. 0.99")


def _attention(a: AttentionSpec, path: str) -> None:
    if a.kind not in ATTENTION_KINDS:
        _fail(path, "kind", a.kind, f"one of {', '.join(ATTENTION_KINDS)}")
    _positive(a, path, "num_heads")
    if a.kind == "gqa":
        _positive(a, path, "num_kv_heads", "head_dim")
        if a.num_heads % a.num_kv_heads:
            _fail(path, "num_kv_heads", a.num_kv_heads, f"a divisor of num_heads ({a.num_heads})")
    else:
        _positive(a, path, "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    _non_negative(a, path, "sparse_top_k_tokens", "sliding_window_tokens", "sliding_window_layer_period")
    if a.sparse_top_k_tokens > 0 and a.kind != "mla":
        _fail(path, "sparse_top_k_tokens", a.sparse_top_k_tokens, "0 for GQA (DSA is modelled for MLA only)")
    if (a.indexer_num_heads > 0) != (a.indexer_head_dim > 0):
        _fail(
            path,
            "indexer_head_dim",
            a.indexer_head_dim,
            "set together with indexer_num_heads (both or neither)",
        )
    if (a.sliding_window_tokens > 0) != (a.sliding_window_layer_period > 0):
        _fail(
            path,
            "sliding_window_layer_period",
            a.sliding_window_layer_period,
            "set with sliding_window_tokens",
        )


def _ffn(f: FfnSpec, path: str) -> None:
    _positive(f, path, "intermediate_size")
    _non_negative(f, path, "num_dense_layers", "num_routed_experts", "num_shared_experts")
    if f.num_routed_experts > 0:
        _positive(f, path, "num_active_experts", "moe_intermediate_size")
        if f.num_active_experts > f.num_routed_experts:
            _fail(
                path,
                "num_active_experts",
                f.num_active_experts,
                f"<= num_routed_experts ({f.num_routed_experts})",
            )


def _model(m: ModelSpec, path: str) -> None:
    _positive(
        m, path, "num_layers", "hidden_size", "vocab_size", "weight_bytes_per_param", "max_context_tokens"
    )
    _attention(m.attention, _join(path, "attention"))
    _ffn(m.ffn, _join(path, "ffn"))
    if m.kv_cache_format not in KV_CACHE_FORMATS:
        _fail(path, "kv_cache_format", m.kv_cache_format, f"one of {', '.join(KV_CACHE_FORMATS)}")
    if m.kv_cache_format == "mla-fp8" and m.attention.kind != "mla":
        _fail(
            path,
            "kv_cache_format",
            m.kv_cache_format,
            "a GQA format (fp32, bf16, fp16, fp8) for GQA attention",
        )
    if m.kv_includes_indexer and m.attention.indexer_head_dim == 0:
        _fail(path, "kv_includes_indexer", True, "false: the model has no DSA indexer")
    if m.ffn.num_dense_layers > m.num_layers:
        _fail(
            _join(path, "ffn"), "num_dense_layers", m.ffn.num_dense_layers, f"<= num_layers ({m.num_layers})"
        )


def _scheduler(s: SchedulerSpec, path: str) -> None:
    _positive(
        s,
        path,
        "alpha_read_s",
        "beta_compute_s",
        "de_token_threshold_factor",
        "compute_quota_s",
        "block_tokens",
    )


def _cluster(c: ClusterSpec, path: str) -> None:
    _hardware(c.hardware, _join(path, "hardware"))
    _model(c.model, _join(path, "model"))
    _scheduler(c.scheduler, _join(path, "scheduler"))
    _positive(c, path, "num_prefill_nodes", "num_decode_nodes")


def _positive(spec: object, path: str, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        if not value > 0:
            _fail(path, name, value, "a value > 0")


def _non_negative(spec: object, path: str, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        if value < 0:
            _fail(path, name, value, "a value >= 0")


def _fail(path: str, name: str, value: object, expected: str) -> None:
    raise ConfigError(f"{_join(path, name)} = {value!r}: expected {expected}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
