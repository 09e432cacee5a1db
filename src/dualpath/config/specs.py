"""Typed, frozen specs shared by every part of DualPath.

These are the project's shared vocabulary. Field names carry units (`_bytes`, `_bytes_per_s`, `_s`,
`_tokens`, `_flops`). Human units ("400Gbps", "80GiB", "300ms") are parsed at the edge
(`dualpath.units`, `dualpath.config.loader`); inside the program every number is in base SI units
(bytes, bytes/s, seconds, FLOP/s).

Derived quantities (KV bytes per token, FLOPs per token) are *not* fields: they are computed from
the architecture in `dualpath.architecture.arch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator. Peaks are dense (no sparsity)."""

    name: str
    peak_bf16_flops_per_s: float
    peak_fp8_flops_per_s: float
    hbm_bytes: float
    hbm_bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One node of the cluster (paper §2.3, §7.1): g GPUs, one CNIC per GPU, one SNIC per node."""

    name: str
    gpu: GpuSpec
    gpus_per_node: int
    cnic_bytes_per_s: float  # one compute NIC, per direction
    snic_bytes_per_s: float  # the node's storage NIC, per direction
    dram_bytes_per_s: float  # host DRAM, half-duplex: reads and writes share it (paper §4.2)
    pcie_bytes_per_s: float  # one GPU's PCIe link, per direction
    dram_buffer_bytes: float  # PE/DE buffer in host DRAM per node (paper A.4)
    storage_bytes_per_s: float  # aggregate bandwidth of the storage cluster (3FS), per direction
    # Fraction of a link's bandwidth the high-priority (model) traffic class gets under WRR (paper §5.1).
    high_priority_share: float = 0.99


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """Attention architecture. `kind` is "gqa" (covers MHA/MQA) or "mla"."""

    kind: str
    num_heads: int
    num_kv_heads: int = 0  # GQA only
    head_dim: int = 0  # GQA only
    # MLA (DeepSeek-V2/V3 style); zero when not MLA.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek Sparse Attention: main attention reads top-k keys per query; 0 means dense.
    sparse_top_k_tokens: int = 0
    indexer_num_heads: int = 0
    indexer_head_dim: int = 0
    # MLA prefill form. False: keys/values are up-projected per head (the "MHA" form, PUBLIC-FACTS
    # per-pair cost 2h(d_nope+d_rope) + 2h·d_v). True: queries are absorbed into the latent space and
    # attention runs over the 576-wide latent cache (MQA form), as FlashMLA's sparse prefill kernel
    # `flash_mla_sparse_fwd` does for DeepSeek-V3.2 (q dim 576, d_v 512).
    mla_absorbed_prefill: bool = False
    # Sliding-window attention (e.g. GPT-OSS): layer i attends to its last `sliding_window_tokens`
    # tokens when `sliding_window_layer_period > 0 and i % sliding_window_layer_period == 0`;
    # such a layer also keeps only that window of KV. 0 disables.
    sliding_window_tokens: int = 0
    sliding_window_layer_period: int = 0


@dataclass(frozen=True, kw_only=True)
class FfnSpec:
    """Feed-forward: dense SwiGLU, or MoE with routed + shared experts after some leading dense layers."""

    intermediate_size: int  # dense layers' FFN width
    num_dense_layers: int = 0  # leading dense layers in an MoE model (all layers when not MoE)
    num_routed_experts: int = 0  # 0 means a dense model
    num_active_experts: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    attention: AttentionSpec
    ffn: FfnSpec
    weight_bytes_per_param: float  # 1 for FP8 weights, 2 for BF16
    # KV cache element format: "fp32", "bf16", "fp16", "fp8" (1 B/elem), or "mla-fp8" (DeepSeek FP8 MLA cache:
    # 512 B latent + 16 B scales + 128 B BF16 RoPE = 656 B per token per layer).
    kv_cache_format: str
    # Whether the DSA indexer's key cache is stored with the KV (and so loaded from storage).
    kv_includes_indexer: bool = False
    max_context_tokens: int = 131072
    # Input embedding and LM head share one matrix (counts once in `weight_bytes`).
    tied_embeddings: bool = False


@dataclass(frozen=True, kw_only=True)
class SchedulerSpec:
    """Request-scheduler constants (paper §6, Appendix A.4)."""

    alpha_read_s: float = 3.0  # α = tokens readable from storage in this many seconds
    beta_compute_s: float = 5.0  # β = miss tokens one GPU computes in this many seconds
    de_token_threshold_factor: float = 1.05  # Z = 1.05 × average tokens (§6.2)
    compute_quota_s: float = 0.300  # per-batch attention-time quota on PEs (§6.4)
    block_tokens: int = 64  # Full Block size in tokens (paper's example, §4.1)


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A PD-disaggregated cluster: P prefill nodes and D decode nodes of one hardware kind."""

    hardware: HardwareSpec
    model: ModelSpec
    num_prefill_nodes: int
    num_decode_nodes: int
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    name: str = ""  # the preset's name, when loaded from one
