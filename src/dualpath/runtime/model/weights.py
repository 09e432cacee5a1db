"""Weights of the decoder as plain tensors, and seeded random initialisation.

Names follow Hugging Face Llama/Qwen2 (`hf_folder.py` maps them one to one). Random weights are drawn
on the CPU from a private `torch.Generator(seed)` and only then moved to the device, so the same seed
gives the same weights on CPU and CUDA and no global RNG is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dualpath.runtime.model.config import TransformerConfig


@dataclass(frozen=True, kw_only=True)
class LayerWeights:
    """One decoder layer. Linear weights are `[out_features, in_features]` (the `F.linear` layout)."""

    input_norm: torch.Tensor
    q_w: torch.Tensor
    k_w: torch.Tensor
    v_w: torch.Tensor
    o_w: torch.Tensor
    post_norm: torch.Tensor
    gate_w: torch.Tensor
    up_w: torch.Tensor
    down_w: torch.Tensor
    q_b: torch.Tensor | None = None
    k_b: torch.Tensor | None = None
    v_b: torch.Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden]; the same tensor as `embed` when tied


def random_weights(config: TransformerConfig, *, seed: int = 0) -> ModelWeights:
    """Seeded random weights.

    Linear weights are N(0, 1/fan_in) and embeddings N(0, 1), so activations keep unit scale through the
    layers and the logits of a random model are spread out (top-2 gaps far above rounding noise), which
    keeps greedy decoding of a random model meaningful. HF's N(0, 0.02) would give near-uniform logits.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        cpu = torch.randn(*shape, generator=generator, dtype=torch.float32) * std
        return cpu.to(device=config.device, dtype=config.torch_dtype)

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return normal(out_features, in_features, std=1.0 / math.sqrt(in_features))

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, device=config.device, dtype=config.torch_dtype)

    hidden, q_dim, kv_dim = config.hidden_size, config.num_heads * config.head_dim, config.kv_dim
    embed = normal(config.vocab_size, hidden, std=1.0)
    layers = tuple(
        LayerWeights(
            input_norm=ones(hidden),
            q_w=linear(q_dim, hidden),
            k_w=linear(kv_dim, hidden),
            v_w=linear(kv_dim, hidden),
            o_w=linear(hidden, q_dim),
            post_norm=ones(hidden),
            gate_w=linear(config.intermediate_size, hidden),
            up_w=linear(config.intermediate_size, hidden),
            down_w=linear(hidden, config.intermediate_size),
            q_b=normal(q_dim, std=0.1) if config.qkv_bias else None,
            k_b=normal(kv_dim, std=0.1) if config.qkv_bias else None,
            v_b=normal(kv_dim, std=0.1) if config.qkv_bias else None,
        )
        for _ in range(config.num_layers)
    )
    lm_head = embed if config.tie_word_embeddings else linear(config.vocab_size, hidden)
    return ModelWeights(embed=embed, layers=layers, final_norm=ones(hidden), lm_head=lm_head)


def check_weights(config: TransformerConfig, weights: ModelWeights) -> None:
    """Raise ValueError naming the first tensor whose shape does not fit `config`."""
    hidden, q_dim, kv_dim, ffn = (
        config.hidden_size,
        config.num_heads * config.head_dim,
        config.kv_dim,
        config.intermediate_size,
    )
    expected: dict[str, tuple[int, ...]] = {
        "input_norm": (hidden,),
        "q_w": (q_dim, hidden),
        "k_w": (kv_dim, hidden),
        "v_w": (kv_dim, hidden),
        "o_w": (hidden, q_dim),
        "post_norm": (hidden,),
        "gate_w": (ffn, hidden),
        "up_w": (ffn, hidden),
        "down_w": (hidden, ffn),
    }
    if config.qkv_bias:
        expected.update(q_b=(q_dim,), k_b=(kv_dim,), v_b=(kv_dim,))
    if len(weights.layers) != config.num_layers:
        raise ValueError(f"weights have {len(weights.layers)} layers, config says {config.num_layers}")
    for index, layer in enumerate(weights.layers):
        for name, shape in expected.items():
            tensor = getattr(layer, name)
            if tensor is None or tuple(tensor.shape) != shape:
                got = None if tensor is None else tuple(tensor.shape)
                raise ValueError(f"layer {index} {name}: expected shape {shape}, got {got}")
    for name, shape in (
        ("embed", (config.vocab_size, hidden)),
        ("final_norm", (hidden,)),
        ("lm_head", (config.vocab_size, hidden)),
    ):
        if tuple(getattr(weights, name).shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(getattr(weights, name).shape)}")
