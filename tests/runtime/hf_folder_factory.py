"""Small Hugging Face model folders written by tests (never downloaded): a random-weight Llama (or Qwen2)
checkpoint, a byte-level BPE tokenizer trained here by the `tokenizers` package, and a tokenizer_config.json
with special tokens and a chat template.

    from hf_folder_factory import write_model_folder
    folder = write_model_folder(tmp_path / "tiny-chat", dtype="bfloat16", sharded=True)

The folder is what `dualpath serve --model DIR` and `dualpath plan --model DIR` read.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from dualpath.runtime.model import Transformer, TransformerConfig
from dualpath.runtime.model.config import config_to_hf
from dualpath.runtime.model.hf_folder import tensors_of

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (BOS, EOS, PAD)
# Zephyr-style: BOS written by the template, one block per message closed by EOS, unknown roles refused.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "An agent reads the file, runs the tests, and fixes the bug.",
    "KV cache blocks are read from storage by the prefill or the decode engine.",
    "Hello, world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n",
    "<|system|>\n<|user|>\n<|assistant|>\n",
    "héllo wörld ✓ 数字 1234567890",
]


@lru_cache(maxsize=4)
def trained_tokenizer_json(vocab_size: int = 384) -> str:
    """A byte-level BPE tokenizer (GPT-2 style: any UTF-8 text round-trips) as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return str(tokenizer.to_str())


def model_config(vocab_size: int, *, dtype: str = "float32", **overrides: Any) -> TransformerConfig:
    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_tokens=2048,
        dtype=dtype,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def write_model_folder(
    folder: Path,
    *,
    dtype: str = "bfloat16",
    sharded: bool = False,
    seed: int = 0,
    architecture: str = "LlamaForCausalLM",
    chat_template: str | None = CHAT_TEMPLATE,
    **config_overrides: Any,
) -> Path:
    """Write a complete model folder; returns it. `sharded` splits the weights over two files with a
    `model.safetensors.index.json`, as large checkpoints are published."""
    from tokenizers import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer_json = trained_tokenizer_json()
    (folder / "tokenizer.json").write_text(tokenizer_json)
    tokenizer = Tokenizer.from_str(tokenizer_json)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    if architecture == "Qwen2ForCausalLM":
        config_overrides.setdefault("qkv_bias", True)
    config = model_config(tokenizer.get_vocab_size(), dtype=dtype, **config_overrides)
    model = Transformer.random(config, seed=seed)
    hf = config_to_hf(config, architecture=architecture)
    hf |= {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "torch_dtype": dtype}
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    tokenizer_config: dict[str, Any] = {
        "bos_token": BOS,
        "eos_token": {"content": EOS, "special": True},  # the AddedToken form some exports write
        "pad_token": PAD,
        "model_max_length": config.max_position_tokens,
    }
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    tensors = tensors_of(model)
    if not sharded:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    weight_map = {}
    for file, shard in shards.items():
        save_file({n: tensors[n] for n in shard}, str(folder / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, file)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}  # fmt: skip
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return folder
