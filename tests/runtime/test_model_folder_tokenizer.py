"""A model folder's tokenizer and chat template (the `hf_folder_factory` folders), the byte tokenizer's
template, the ModelSpec and runtime model built from a folder, and errors that name the missing path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_folder_factory import BOS, CHAT_TEMPLATE, EOS, write_model_folder

from dualpath.architecture.arch import kv_bytes_per_token_per_layer
from dualpath.config.loader import load_model
from dualpath.runtime.model import ByteTokenizer, ReferenceEngine, load_hf_folder, load_tokenizer
from dualpath.runtime.model.config import config_from_hf
from dualpath.runtime.model.tokenizer import ChatTemplateError, HfTokenizer
from dualpath.runtime.model_host import build_model, model_tokenizer, resolve_model, served_model_name

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello, world! héllo ✓"},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_folder(tmp_path_factory.mktemp("m") / "tiny-chat", dtype="bfloat16", sharded=True)


def test_folder_tokenizer_round_trips_and_knows_its_specials(folder: Path) -> None:
    tokenizer = load_tokenizer(folder)
    assert isinstance(tokenizer, HfTokenizer)
    assert tokenizer.bos_token == BOS and tokenizer.bos_id == tokenizer._tokenizer.token_to_id(BOS)
    assert tokenizer.eos_id == tokenizer._tokenizer.token_to_id(EOS) and tokenizer.eos_token_ids == (
        tokenizer.eos_id,
    )
    ids = tokenizer.encode("héllo wörld ✓ 数字")
    assert ids[0] == tokenizer.bos_id and tokenizer.decode(ids) == "héllo wörld ✓ 数字"
    assert tokenizer.encode("abc", add_bos=False)[0] != tokenizer.bos_id
    assert tokenizer.vocab_size == load_hf_folder(folder).config.vocab_size


def test_chat_template_renders_as_hugging_face_and_encodes_one_bos(folder: Path) -> None:
    tokenizer = load_tokenizer(folder)
    text = tokenizer.apply_chat_template(MESSAGES)
    assert text == (f"{BOS}<|system|>\nBe brief.{EOS}\n<|user|>\nHello, world! héllo ✓{EOS}\n<|assistant|>\n")
    assert not tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith(
        "<|assistant|>\n"
    )
    ids = tokenizer.encode_chat(MESSAGES)
    assert ids.count(tokenizer.bos_id) == 1 and ids[0] == tokenizer.bos_id  # the template's, not a second
    assert ids == tokenizer.encode(text) == tokenizer.encode(text, add_bos=False)
    assert ids.count(tokenizer.eos_id) == 2  # "</s>" in the text is the special token, not its characters
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}])


def test_eos_ids_from_generation_config_and_a_missing_template(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "m", dtype="float32", chat_template=None)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 5]}))
    tokenizer = load_tokenizer(folder)
    assert tokenizer.eos_token_ids == (1, 5)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.apply_chat_template(MESSAGES)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    assert load_tokenizer(folder).apply_chat_template(MESSAGES).startswith(BOS)


def test_byte_tokenizer_has_a_default_chat_template() -> None:
    tokenizer = ByteTokenizer()
    text = tokenizer.apply_chat_template(MESSAGES)
    assert text == "<|system|>\nBe brief.\n<|user|>\nHello, world! héllo ✓\n<|assistant|>\n"
    ids = tokenizer.encode_chat(MESSAGES)
    assert ids[0] == tokenizer.bos_id and tokenizer.decode(ids) == text
    assert model_tokenizer("tiny-llama") == tokenizer


def test_model_spec_and_runtime_model_follow_the_folder(folder: Path) -> None:
    spec = load_model(str(folder))
    model = build_model(str(folder), device="cpu", seed=0)
    assert spec.name == "tiny-chat" == served_model_name(str(folder))
    assert model.config.dtype == "bfloat16" and spec.kv_cache_format == "bf16"
    assert kv_bytes_per_token_per_layer(spec) == model.config.kv_bytes_per_token_per_layer == 2 * 2 * 16 * 2
    assert spec.max_context_tokens == model.config.max_position_tokens == 2048
    assert build_model(str(folder), device="cpu", seed=0, dtype="float32").config.dtype == "float32"
    assert resolve_model(str(folder)) == str(folder.resolve()) and resolve_model("tiny-llama") == "tiny-llama"


def test_bf16_prefill_and_decode_agree(folder: Path) -> None:
    """bf16 on CPU: decoding token by token gives the tokens a one-shot prefill of the result predicts,
    and a decode step batched with another sequence gives the same logits as alone."""
    model = load_hf_folder(folder)
    prompt = list(range(3, 43))
    tokens = ReferenceEngine(model).generate(prompt, 16)
    logits = model.prefill(prompt + tokens, all_logits=True).logits
    assert [int(logits[len(prompt) - 1 + i].argmax()) for i in range(16)] == tokens
    kv = model.prefill(prompt).kv
    other = model.prefill(list(range(100, 130))).kv
    alone = model.decode_step([7], [kv]).logits[0]
    assert torch.equal(alone, model.decode_step([7, 9], [kv, other]).logits[0])


def test_missing_folder_or_file_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "none")):
        resolve_model(str(tmp_path / "none"))
    folder = write_model_folder(tmp_path / "m", dtype="float32", sharded=True)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.rename(tmp_path / "away")
    with pytest.raises(FileNotFoundError, match=str(shard)):
        load_hf_folder(folder)
    (tmp_path / "away").rename(shard)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=str(folder / "tokenizer.json")):
        resolve_model(str(folder))
    with pytest.raises(FileNotFoundError, match=str(folder / "tokenizer.json")):
        load_tokenizer(folder)


def test_mistral_folders_load_and_binding_sliding_windows_are_refused() -> None:
    hf = {
        "architectures": ["MistralForCausalLM"],
        "vocab_size": 100,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "sliding_window": None,
    }
    assert config_from_hf(hf).num_kv_heads == 2
    assert config_from_hf({**hf, "sliding_window": 4096}).num_layers == 2
    with pytest.raises(ValueError, match="sliding_window"):
        config_from_hf({**hf, "sliding_window": 1024})
    assert config_from_hf({**hf, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 1024,
                           "use_sliding_window": False}).qkv_bias  # fmt: skip
