"""Tokenizers: byte-level for the preset models; a local Hugging Face folder's `tokenizer.json` (through the
`tokenizers` package) for a served model folder. Both render chat messages with a Jinja2 chat template.

The byte tokenizer needs no file and no download: ids 0-255 are the bytes of the UTF-8 text, then the
specials (BOS, EOS, PAD, UNK). Its vocabulary (260) is the `tiny-llama` preset's vocab size; its chat
template is `DEFAULT_CHAT_TEMPLATE`.

NOTE: BOS and chat templates. Hugging Face renders a conversation with the template, which usually emits
the BOS token's text itself (`{{ bos_token }}`), and then tokenizes the text without adding specials. Here
`encode(text, add_bos=True)` adds BOS only when the text does not already start with it, so encoding a
rendered conversation gives one BOS whether or not the template wrote it; `encode_chat` does both steps.
The byte tokenizer has no text form for BOS (id 256): its template writes none and `encode` adds it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

ChatMessages = Sequence[Mapping[str, str]]

# The byte tokenizer's chat template (and the shape of the common ChatML-like ones): one block per message
# with its role, then the assistant's header when a reply is wanted.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """A conversation the chat template refuses (its `raise_exception`), or a model without a template."""


class Tokenizer(Protocol):
    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def bos_token(self) -> str | None: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: ChatMessages, *, add_generation_prompt: bool = True) -> str: ...

    def encode_chat(self, messages: ChatMessages, *, add_generation_prompt: bool = True) -> list[int]: ...


@dataclass(frozen=True, kw_only=True)
class ByteTokenizer:
    """ids 0-255 = bytes; 256 = BOS, 257 = EOS, 258 = PAD, 259 = UNK (vocab 260)."""

    bos_id: int = 256
    eos_id: int = 257
    pad_id: int = 258
    unk_id: int = 259
    chat_template: str = DEFAULT_CHAT_TEMPLATE

    @property
    def vocab_size(self) -> int:
        return 260

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (self.eos_id,)

    @property
    def bos_token(self) -> str | None:
        """BOS has no text form here (id 256 is not a byte)."""
        return None

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Bytes back to text; specials are dropped and broken UTF-8 becomes U+FFFD."""
        return bytes(token for token in token_ids if 0 <= token < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: ChatMessages, *, add_generation_prompt: bool = True) -> str:
        # The specials have no text form here; the template variables exist so that any template renders.
        specials = {"bos_token": "", "eos_token": "", "pad_token": "", "unk_token": ""}
        return render_chat_template(
            self.chat_template, messages, add_generation_prompt=add_generation_prompt, special_tokens=specials
        )

    def encode_chat(self, messages: ChatMessages, *, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))


class HfTokenizer:
    """A Hugging Face folder's tokenizer: `tokenizer.json` (the `tokenizers` package, never downloaded),
    the special tokens and chat template of `tokenizer_config.json`, and the EOS ids of `config.json` /
    `generation_config.json` (instruct models often end on several)."""

    def __init__(
        self,
        path: Path,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        special_tokens: Mapping[str, str | None] | None = None,
        chat_template: str | None = None,
        eos_token_ids: Sequence[int] = (),
        add_bos: bool = True,
    ) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ModuleNotFoundError as error:
            raise RuntimeError(
                f"{path} needs the 'tokenizers' package, which is not installed; "
                "install it or use the byte tokenizer (no tokenizer.json)"
            ) from error
        self.path = path
        self._tokenizer: Any = _Tokenizer.from_file(str(path))
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_token_ids = tuple(dict.fromkeys([*([] if eos_id is None else [eos_id]), *eos_token_ids]))
        self.special_tokens = dict(special_tokens or {})
        self.chat_template = chat_template
        self.add_bos = add_bos

    @classmethod
    def from_folder(cls, folder: str | Path) -> HfTokenizer:
        """The tokenizer of a model folder; a missing `tokenizer.json` is an error naming the path."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (a served model folder needs its tokenizer.json)")
        tokenizer_config = _read_json(folder / "tokenizer_config.json")
        special = {
            name: _token_text(tokenizer_config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        model_config = _read_json(folder / "config.json")
        generation_config = _read_json(folder / "generation_config.json")
        tokenizer = cls(path)
        bos_id = tokenizer._id_of(special["bos_token"])
        if bos_id is None and special["bos_token"] is None:
            bos_id = _first_id(model_config.get("bos_token_id"))
        eos_ids = [tokenizer._id_of(special["eos_token"])]
        for config in (model_config, generation_config):
            value = config.get("eos_token_id")
            eos_ids += value if isinstance(value, list) else [value]
        eos = list(dict.fromkeys(int(i) for i in eos_ids if isinstance(i, int)))
        tokenizer.bos_id = bos_id
        tokenizer.eos_id = eos[0] if eos else None
        tokenizer.eos_token_ids = tuple(eos)
        tokenizer.special_tokens = special
        tokenizer.chat_template = _chat_template(folder, tokenizer_config)
        tokenizer.add_bos = bool(tokenizer_config.get("add_bos_token", True))
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids: list[int] = list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        if add_bos and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            return [self.bos_id, *ids]
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def apply_chat_template(self, messages: ChatMessages, *, add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise ChatTemplateError(f"{self.path.parent} has no chat template (tokenizer_config.json)")
        specials = {name: value or "" for name, value in self.special_tokens.items()}
        return render_chat_template(
            self.chat_template, messages, add_generation_prompt=add_generation_prompt, special_tokens=specials
        )

    def encode_chat(self, messages: ChatMessages, *, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))

    def _id_of(self, token: str | None) -> int | None:
        if token is None:
            return None
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)


def load_tokenizer(folder: str | Path | None = None) -> Tokenizer:
    """The byte tokenizer (no folder: a preset model), or the model folder's tokenizer."""
    if folder is None:
        return ByteTokenizer()
    return HfTokenizer.from_folder(folder)


def render_chat_template(
    template: str,
    messages: ChatMessages,
    *,
    add_generation_prompt: bool,
    special_tokens: Mapping[str, str],
) -> str:
    """Render `messages` as Hugging Face does: a sandboxed Jinja2 environment with `trim_blocks` and
    `lstrip_blocks`, `raise_exception`, `strftime_now` and a `tojson` that keeps non-ASCII text."""
    import jinja2

    try:
        compiled = _compile(template)
        return str(
            compiled.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                **special_tokens,
            )
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"chat template: {error}") from None


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    """The compiled template (a pure function of its text, so compiled once per text)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as `tokenizer_config.json` writes it: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _first_id(value: Any) -> int | None:
    value = value[0] if isinstance(value, list) and value else value
    return value if isinstance(value, int) else None


def _chat_template(folder: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    """`chat_template` of tokenizer_config.json (a string, or a list of named templates: "default"), or a
    `chat_template.jinja` file beside it (newer exports)."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str):
        return template
    path = folder / "chat_template.jinja"
    return path.read_text() if path.is_file() else None
