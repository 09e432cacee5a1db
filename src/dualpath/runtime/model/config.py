"""`TransformerConfig`: the shape of the runtime's Llama/Qwen2-style decoder.

The config is plain data (dtype and device are strings) so that it can cross a process boundary and be
written to a log. `device` is a config value: "cpu" here, "cuda" where a GPU exists; the code is the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dualpath.config.specs import ModelSpec

_DTYPES: Mapping[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

# Llama-2 defaults (Hugging Face `LlamaConfig`), used when a `ModelSpec` does not say.
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_RMS_EPS = 1e-5


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """A dense GQA decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.

    `qkv_bias` is True for Qwen2 (q/k/v projections carry a bias). `dtype` is also the KV-cache element
    type, so it fixes `kv_bytes_per_token_per_layer`. float32 is the default because it makes the model
    bit-reproducible on CPU (see `numerics.py`).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = DEFAULT_ROPE_THETA
    rms_eps: float = DEFAULT_RMS_EPS
    max_position_tokens: int = 32768
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")
        for name in (*positive, "intermediate_size", "max_position_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TransformerConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @classmethod
    def from_model_spec(cls, spec: ModelSpec, **overrides: Any) -> TransformerConfig:
        """See `config_from_model_spec`."""
        return config_from_model_spec(spec, **overrides)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides: Any) -> TransformerConfig:
        """See `config_from_hf`."""
        return config_from_hf(hf, **overrides)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def kv_dim(self) -> int:
        """Elements of K (or of V) for one token in one layer: all kv heads side by side."""
        return self.num_kv_heads * self.head_dim

    @property
    def kv_row_elems(self) -> int:
        """Elements of one Layer Block row: [K(kv_heads x head_dim) | V(kv_heads x head_dim)]."""
        return 2 * self.kv_dim

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        element_bytes = torch.empty((), dtype=self.torch_dtype).element_size()
        return self.kv_row_elems * element_bytes


# ModelSpec.kv_cache_format -> the runtime dtype that stores KV in exactly that many bytes per element.
_KV_FORMAT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def config_from_model_spec(
    spec: ModelSpec,
    *,
    dtype: str | None = None,
    device: str = "cpu",
    rope_theta: float = DEFAULT_ROPE_THETA,
    rms_eps: float = DEFAULT_RMS_EPS,
) -> TransformerConfig:
    """The runtime config for a dense GQA `ModelSpec` preset (e.g. `tiny-llama`).

    `dtype` defaults to the spec's `kv_cache_format` ("fp32" -> float32), so the runtime's KV bytes per
    token per layer equal `dualpath.architecture.arch.kv_bytes_per_token_per_layer(spec)`, the number the
    simulator and the planner use. `rope_theta` and `rms_eps` are not in a `ModelSpec`; Llama-2
    defaults apply.
    """
    attention, ffn = spec.attention, spec.ffn
    if attention.kind != "gqa":
        raise ValueError(f"model {spec.name!r}: the runtime model supports attention kind 'gqa' only")
    if ffn.num_routed_experts:
        raise ValueError(f"model {spec.name!r}: the runtime model supports dense FFNs only, not MoE")
    if getattr(attention, "sliding_window_tokens", 0):
        raise ValueError(f"model {spec.name!r}: the runtime model has no sliding-window attention")
    if dtype is None:
        if spec.kv_cache_format not in _KV_FORMAT_DTYPES:
            raise ValueError(
                f"model {spec.name!r}: kv_cache_format {spec.kv_cache_format!r} has no runtime dtype; "
                f"pass dtype= one of {sorted(_DTYPES)}"
            )
        dtype = _KV_FORMAT_DTYPES[spec.kv_cache_format]
    return TransformerConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
        num_heads=attention.num_heads,
        num_kv_heads=attention.num_kv_heads,
        head_dim=attention.head_dim,
        intermediate_size=ffn.intermediate_size,
        rope_theta=rope_theta,
        rms_eps=rms_eps,
        max_position_tokens=spec.max_context_tokens,
        tie_word_embeddings=getattr(spec, "tied_embeddings", False),
        dtype=dtype,
        device=device,
    )


HF_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


def config_from_hf(
    hf: Mapping[str, Any], *, dtype: str = "float32", device: str = "cpu"
) -> TransformerConfig:
    """Map a Hugging Face `config.json` (Llama, Qwen2 or Mistral) to a `TransformerConfig`."""
    architectures = hf.get("architectures") or []
    architecture = architectures[0] if architectures else ""
    if architecture not in HF_ARCHITECTURES:
        raise ValueError(f"config.json: architecture {architecture!r} is not one of {HF_ARCHITECTURES}")
    if hf.get("rope_scaling"):
        raise ValueError(
            "config.json: rope_scaling is not supported by the runtime model; remove it or use another model"
        )
    if _sliding_window(hf) is not None:
        raise ValueError(
            f"config.json: sliding_window = {_sliding_window(hf)} is shorter than the context; the runtime "
            "model attends to every earlier token"
        )
    num_heads = int(hf["num_attention_heads"])
    hidden_size = int(hf["hidden_size"])
    is_qwen2 = architecture == "Qwen2ForCausalLM"
    return TransformerConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden_size,
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(hf.get("head_dim") or hidden_size // num_heads),
        intermediate_size=int(hf["intermediate_size"]),
        rope_theta=float(hf.get("rope_theta", DEFAULT_ROPE_THETA)),
        rms_eps=float(hf.get("rms_norm_eps", DEFAULT_RMS_EPS)),
        max_position_tokens=int(hf.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=is_qwen2 or bool(hf.get("attention_bias", False)),
        dtype=dtype,
        device=device,
    )


def _sliding_window(hf: Mapping[str, Any]) -> int | None:
    """A sliding window that binds (Mistral v0.1: 4,096 of 32,768), or None. Qwen2 writes one but turns
    it off with `use_sliding_window: false`; a window as long as the context changes nothing."""
    window = hf.get("sliding_window")
    if not window or hf.get("use_sliding_window") is False:
        return None
    return int(window) if int(window) < int(hf.get("max_position_embeddings", 32768)) else None


def config_to_hf(config: TransformerConfig, *, architecture: str = "LlamaForCausalLM") -> dict[str, Any]:
    """The `config.json` that `config_from_hf` reads back to `config` (dtype and device aside)."""
    if architecture not in HF_ARCHITECTURES:
        raise ValueError(f"architecture must be one of {HF_ARCHITECTURES}, got {architecture!r}")
    if config.qkv_bias != (architecture == "Qwen2ForCausalLM"):
        raise ValueError(f"{architecture} needs qkv_bias={architecture == 'Qwen2ForCausalLM'}")
    return {
        "architectures": [architecture],
        "model_type": architecture.removesuffix("ForCausalLM").lower(),
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_eps,
        "max_position_embeddings": config.max_position_tokens,
        "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": config.dtype,
    }
