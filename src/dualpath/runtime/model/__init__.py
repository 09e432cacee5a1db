"""The runtime's model: a Llama/Qwen2-style decoder in plain PyTorch with a per-layer prefill API, KV in
the Layer Block layout, a paged KV cache, and an in-process reference engine. See docs/model.md."""

from dualpath.runtime.model.config import TransformerConfig, config_from_hf, config_from_model_spec
from dualpath.runtime.model.hf_folder import load_hf_folder, save_hf_folder
from dualpath.runtime.model.kv_layout import (
    LayerKV,
    full_block_to_bytes,
    layer_block_offset_bytes,
    layer_kv_from_buffer,
    layer_kv_to_bytes,
    pack_kv,
    unpack_kv,
)
from dualpath.runtime.model.paged_cache import PagedKVCache
from dualpath.runtime.model.reference import Generation, ReferenceEngine, ReferenceSession
from dualpath.runtime.model.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from dualpath.runtime.model.transformer import DecodeOutput, PrefillOutput, Transformer
from dualpath.runtime.model.weights import LayerWeights, ModelWeights, random_weights

__all__ = [
    "ByteTokenizer",
    "DecodeOutput",
    "Generation",
    "LayerKV",
    "LayerWeights",
    "ModelWeights",
    "PagedKVCache",
    "PrefillOutput",
    "ReferenceEngine",
    "ReferenceSession",
    "Tokenizer",
    "Transformer",
    "TransformerConfig",
    "config_from_hf",
    "config_from_model_spec",
    "full_block_to_bytes",
    "layer_block_offset_bytes",
    "layer_kv_from_buffer",
    "layer_kv_to_bytes",
    "load_hf_folder",
    "load_tokenizer",
    "pack_kv",
    "random_weights",
    "save_hf_folder",
    "unpack_kv",
]
