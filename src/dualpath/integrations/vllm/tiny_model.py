"""A tiny random-weight Llama folder for the vLLM tests, benchmark and demo, written on the fly (never
downloaded). vLLM's CPU attention needs head_dim in {32, 64, ...} and blocks of a multiple of 32 tokens."""

from __future__ import annotations

from pathlib import Path

from dualpath.runtime.model import Transformer, TransformerConfig
from dualpath.runtime.model.hf_folder import save_hf_folder

VOCAB = 300


def write_tiny_llama(folder: Path, *, num_layers: int = 4, seed: int = 1) -> Path:
    config = TransformerConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=128,
    )
    save_hf_folder(Transformer.random(config, seed=seed), folder)
    return folder
