"""Architecture math: KV bytes and FLOPs derived from a `ModelSpec` (never typed in).

Everything here is a pure function of the spec. Conventions:
- A FLOP is one multiply or one add, so a multiply-accumulate is 2 FLOPs and a linear layer with
  `p` weights costs `2·p` FLOPs per token.
- "Attention FLOPs" are the score (QKᵀ) and value (PV) products only; projections are linear FLOPs.
- Per-layer functions take `layer_index` (0-based) where layers differ (leading dense FFN layers,
  sliding-window layers).

KV bytes per token per layer (PUBLIC-FACTS.md, "Model architectures"):

    GQA      2 (K,V) · kv_heads · head_dim · element_bytes          Qwen2.5-32B BF16: 4 KiB
    MLA      (kv_lora + d_rope) · element_bytes                      DeepSeek-V3 BF16: 1,152 B
    mla-fp8  kv_lora·1 B + kv_lora/128 · 4 B scales + d_rope · 2 B  DeepSeek FP8:     656 B
    indexer  + indexer_head_dim · 1 B + 4 B scale                    DeepSeek-V3.2:  +132 B
"""

from __future__ import annotations

from typing import Final

from dualpath.config.specs import AttentionSpec, ModelSpec

# Bytes per element of each KV cache format (IEEE fp32 / bf16 / fp16; OCP FP8 E4M3).
KV_ELEMENT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}

# DeepSeek FP8 MLA cache (FlashMLA FP8 sparse decoding kernel, DeepSeek-V3.2): the latent is FP8 with
# one fp32 scale per 128 values, the RoPE part stays BF16.
MLA_FP8_SCALE_TILE_VALUES: Final = 128  # values per fp32 scale (FlashMLA FP8 KV format)
FP32_BYTES: Final = 4.0
BF16_BYTES: Final = 2.0
FP8_BYTES: Final = 1.0


# ----------------------------------------------------------------------------------------------
# KV cache size
# ----------------------------------------------------------------------------------------------


def kv_bytes_per_token_per_layer(m: ModelSpec) -> float:
    """Bytes of KV cache one token occupies in one (full-attention) layer: the Layer Block row."""
    a = m.attention
    if a.kind == "gqa":
        return 2.0 * a.num_kv_heads * a.head_dim * _element_bytes(m.kv_cache_format)
    if a.kind != "mla":
        raise ValueError(f"attention kind {a.kind!r}: expected 'gqa' or 'mla'")
    if m.kv_cache_format == "mla-fp8":
        scales = a.kv_lora_rank / MLA_FP8_SCALE_TILE_VALUES * FP32_BYTES
        main = a.kv_lora_rank * FP8_BYTES + scales + a.qk_rope_head_dim * BF16_BYTES
    else:
        main = (a.kv_lora_rank + a.qk_rope_head_dim) * _element_bytes(m.kv_cache_format)
    return main + (indexer_kv_bytes_per_token(m) if m.kv_includes_indexer else 0.0)


def indexer_kv_bytes_per_token(m: ModelSpec) -> float:
    """DSA indexer key cache per token per layer: FP8 keys plus one fp32 scale (DeepSeek-V3.2)."""
    a = m.attention
    if a.indexer_head_dim == 0:
        return 0.0
    return a.indexer_head_dim * FP8_BYTES + FP32_BYTES


def kv_bytes_per_token(m: ModelSpec) -> float:
    """KV bytes one token adds to the whole model's cache (all layers; windowed layers excluded)."""
    return kv_bytes_per_token_per_layer(m) * num_full_kv_layers(m)


def kv_bytes_for_context(m: ModelSpec, context_tokens: int) -> float:
    """KV bytes a request with `context_tokens` of history holds (what a read must load).

    Sliding-window layers keep only their last window of tokens.
    """
    per_layer = kv_bytes_per_token_per_layer(m)
    windowed = m.num_layers - num_full_kv_layers(m)
    window = min(context_tokens, m.attention.sliding_window_tokens)
    return per_layer * (num_full_kv_layers(m) * context_tokens + windowed * window)


def layer_block_bytes(m: ModelSpec, tokens: int) -> float:
    """One Layer Block `[1, tokens, bytes]` (paper §4.1)."""
    return kv_bytes_per_token_per_layer(m) * tokens


def full_block_bytes(m: ModelSpec, tokens: int) -> float:
    """One Full Block `[layers, tokens, bytes]`: all layers' Layer Blocks, concatenated (§4.1)."""
    return layer_block_bytes(m, tokens) * m.num_layers


def is_sliding_window_layer(m: ModelSpec, layer_index: int) -> bool:
    a = m.attention
    period = a.sliding_window_layer_period
    return a.sliding_window_tokens > 0 and period > 0 and layer_index % period == 0


def num_full_kv_layers(m: ModelSpec) -> int:
    """Layers whose KV grows with the context (not sliding-window)."""
    return sum(1 for i in range(m.num_layers) if not is_sliding_window_layer(m, i))


# ----------------------------------------------------------------------------------------------
# Parameters and linear FLOPs
# ----------------------------------------------------------------------------------------------


def attention_params(m: ModelSpec) -> float:
    """Weights of one layer's attention projections (incl. MLA down/up and the DSA indexer)."""
    a, h = m.attention, m.hidden_size
    if a.kind == "gqa":
        q_width = a.num_heads * a.head_dim
        kv_width = a.num_kv_heads * a.head_dim
        return h * q_width + 2 * h * kv_width + q_width * h
    qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
    if a.q_lora_rank > 0:
        q = h * a.q_lora_rank + a.q_lora_rank * a.num_heads * qk_head
    else:
        q = h * a.num_heads * qk_head
    kv_down = h * (a.kv_lora_rank + a.qk_rope_head_dim)
    kv_up = a.kv_lora_rank * a.num_heads * (a.qk_nope_head_dim + a.v_head_dim)
    out = a.num_heads * a.v_head_dim * h
    return q + kv_down + kv_up + out + _indexer_params(m)


def _indexer_params(m: ModelSpec) -> float:
    """DSA lightning indexer: queries from the Q-LoRA latent (or hidden), one shared key, head weights."""
    a, h = m.attention, m.hidden_size
    if a.indexer_num_heads == 0:
        return 0.0
    q_in = a.q_lora_rank if a.q_lora_rank > 0 else h
    return q_in * a.indexer_num_heads * a.indexer_head_dim + h * a.indexer_head_dim + h * a.indexer_num_heads


def is_moe_layer(m: ModelSpec, layer_index: int) -> bool:
    return m.ffn.num_routed_experts > 0 and layer_index >= m.ffn.num_dense_layers


def ffn_active_params(m: ModelSpec, layer_index: int) -> float:
    """SwiGLU weights one token touches in this layer (gate, up, down = 3 matrices)."""
    f, h = m.ffn, m.hidden_size
    if not is_moe_layer(m, layer_index):
        return 3.0 * h * f.intermediate_size
    experts = f.num_active_experts + f.num_shared_experts
    return experts * 3.0 * h * f.moe_intermediate_size + h * f.num_routed_experts  # + router


def ffn_total_params(m: ModelSpec, layer_index: int) -> float:
    f, h = m.ffn, m.hidden_size
    if not is_moe_layer(m, layer_index):
        return 3.0 * h * f.intermediate_size
    experts = f.num_routed_experts + f.num_shared_experts
    return experts * 3.0 * h * f.moe_intermediate_size + h * f.num_routed_experts


def linear_flops_per_token(m: ModelSpec, layer_index: int) -> float:
    """2 × active weights of this layer's linear ops (attention projections + FFN/MoE)."""
    return 2.0 * (attention_params(m) + ffn_active_params(m, layer_index))


def linear_flops_per_token_all_layers(m: ModelSpec) -> float:
    return sum(linear_flops_per_token(m, i) for i in range(m.num_layers))


def lm_head_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden_size * m.vocab_size


def active_params_per_token(m: ModelSpec) -> float:
    """Weights a token touches: all layers' active linear weights + the LM head (embedding is a lookup)."""
    layers = sum(attention_params(m) + ffn_active_params(m, i) for i in range(m.num_layers))
    return layers + m.hidden_size * m.vocab_size


def total_params(m: ModelSpec) -> float:
    """All weights (norms and biases neglected: < 0.1 % for every preset)."""
    layers = sum(attention_params(m) + ffn_total_params(m, i) for i in range(m.num_layers))
    embeddings = m.vocab_size * m.hidden_size * (1 if m.tied_embeddings else 2)
    return layers + embeddings


def weight_bytes(m: ModelSpec) -> float:
    return total_params(m) * m.weight_bytes_per_param


# ----------------------------------------------------------------------------------------------
# Attention FLOPs
# ----------------------------------------------------------------------------------------------


def causal_key_count(cached_tokens: int, new_tokens: int, cap_tokens: int = 0) -> int:
    """Σ over the new queries i = 1..n of min(P + i, cap): keys each causal query reads.

    With cap = 0 (no cap) this is n·P + n(n+1)/2. A cap models DSA top-k or a sliding window.
    """
    p, n = cached_tokens, new_tokens
    if cap_tokens <= 0:
        return n * p + n * (n + 1) // 2
    uncapped = max(0, min(n, cap_tokens - p))  # queries whose context is still under the cap
    return uncapped * p + uncapped * (uncapped + 1) // 2 + (n - uncapped) * cap_tokens


def _gqa_flops_per_pair(a: AttentionSpec) -> float:
    # QKᵀ and PV: 2·h·d each, so 4·h·d per (query, key) pair (PUBLIC-FACTS).
    return 4.0 * a.num_heads * a.head_dim


def _mla_prefill_flops_per_pair(a: AttentionSpec) -> float:
    if a.mla_absorbed_prefill:
        return _mla_absorbed_flops_per_pair(a)
    # Non-absorbed ("MHA" form): 2h(d_nope+d_rope) for scores + 2h·d_v for values (PUBLIC-FACTS).
    return 2.0 * a.num_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim) + 2.0 * a.num_heads * a.v_head_dim


def _mla_absorbed_flops_per_pair(a: AttentionSpec) -> float:
    # Absorbed ("MQA" form over the latent): 2h(kv_lora+d_rope) + 2h·kv_lora (PUBLIC-FACTS).
    return 2.0 * a.num_heads * (a.kv_lora_rank + a.qk_rope_head_dim) + 2.0 * a.num_heads * a.kv_lora_rank


def _indexer_flops_per_pair(a: AttentionSpec) -> float:
    # Lightning indexer scores every (query, key) pair of the full context: heads × dim dot products.
    return 2.0 * a.indexer_num_heads * a.indexer_head_dim


def attention_flops(
    m: ModelSpec, cached_tokens: int, new_tokens: int, *, layer_index: int | None = None
) -> float:
    """Attention FLOPs of ONE layer for a causal prefill of `new_tokens` over `cached_tokens`.

    `layer_index=None` means a full-attention layer; pass an index to honour sliding windows.
    With DSA the main attention reads min(context, top_k) keys per query and the indexer scans the
    full context (PUBLIC-FACTS, "Attention FLOPs").
    """
    a = m.attention
    if a.kind == "gqa":
        window = 0
        if layer_index is not None and is_sliding_window_layer(m, layer_index):
            window = a.sliding_window_tokens
        return _gqa_flops_per_pair(a) * causal_key_count(cached_tokens, new_tokens, window)
    main = _mla_prefill_flops_per_pair(a) * causal_key_count(cached_tokens, new_tokens, a.sparse_top_k_tokens)
    indexer = _indexer_flops_per_pair(a) * causal_key_count(cached_tokens, new_tokens)
    return main + indexer


def attention_flops_all_layers(m: ModelSpec, cached_tokens: int, new_tokens: int) -> float:
    return sum(attention_flops(m, cached_tokens, new_tokens, layer_index=i) for i in range(m.num_layers))


def decode_attention_flops(m: ModelSpec, context_tokens: int, *, layer_index: int | None = None) -> float:
    """Attention FLOPs of ONE layer for one decode token over `context_tokens` keys (MLA absorbed)."""
    a = m.attention
    if a.kind == "gqa":
        keys = context_tokens
        if layer_index is not None and is_sliding_window_layer(m, layer_index):
            keys = min(keys, a.sliding_window_tokens)
        return _gqa_flops_per_pair(a) * keys
    main_keys = min(context_tokens, a.sparse_top_k_tokens) if a.sparse_top_k_tokens > 0 else context_tokens
    return _mla_absorbed_flops_per_pair(a) * main_keys + _indexer_flops_per_pair(a) * context_tokens


def prefill_flops(m: ModelSpec, cached_tokens: int, new_tokens: int, *, lm_head_tokens: int = 1) -> float:
    """All-layer FLOPs to prefill `new_tokens` over `cached_tokens`, plus the LM head.

    The LM head runs only on positions whose logits are sampled: the last one in a prefill
    (`lm_head_tokens=1`, as vLLM and SGLang do); pass 0 for a non-final chunk.
    """
    linear = new_tokens * linear_flops_per_token_all_layers(m)
    return (
        linear
        + attention_flops_all_layers(m, cached_tokens, new_tokens)
        + lm_head_tokens * (lm_head_flops_per_token(m))
    )


def _element_bytes(kv_cache_format: str) -> float:
    if kv_cache_format not in KV_ELEMENT_BYTES:
        expected = ", ".join([*KV_ELEMENT_BYTES, "mla-fp8"])
        raise ValueError(f"kv_cache_format {kv_cache_format!r}: expected one of {expected}")
    return KV_ELEMENT_BYTES[kv_cache_format]
