"""Tokenizers: byte-level by default; a local `tokenizer.json` through the `tokenizers` package if present.

The byte tokenizer needs no file and no download: ids 0-255 are the bytes of the UTF-8 text, then the
specials (BOS, EOS, PAD, UNK). Its vocabulary (260) is the `tiny-llama` preset's vocab size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Tokenizer(Protocol):
    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


@dataclass(frozen=True, kw_only=True)
class ByteTokenizer:
    """ids 0-255 = bytes; 256 = BOS, 257 = EOS, 258 = PAD, 259 = UNK (vocab 260)."""

    bos_id: int = 256
    eos_id: int = 257
    pad_id: int = 258
    unk_id: int = 259

    @property
    def vocab_size(self) -> int:
        return 260

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Bytes back to text; specials are dropped and broken UTF-8 becomes U+FFFD."""
        return bytes(token for token in token_ids if 0 <= token < 256).decode("utf-8", errors="replace")


class HfTokenizer:
    """A Hugging Face `tokenizer.json`, read with the `tokenizers` package (never downloaded)."""

    def __init__(self, path: Path, *, bos_id: int | None = None, eos_id: int | None = None) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ModuleNotFoundError as error:
            raise RuntimeError(
                f"{path} needs the 'tokenizers' package, which is not installed; "
                "install it or use the byte tokenizer (no tokenizer.json)"
            ) from error
        self._tokenizer: Any = _Tokenizer.from_file(str(path))
        self.bos_id = bos_id
        self.eos_id = eos_id

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids: list[int] = list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids)))


def load_tokenizer(folder: str | Path | None = None) -> Tokenizer:
    """The folder's `tokenizer.json` if there is one, otherwise the byte tokenizer."""
    if folder is None or not (Path(folder) / "tokenizer.json").is_file():
        return ByteTokenizer()
    folder = Path(folder)
    bos_id, eos_id = _special_ids(folder)
    return HfTokenizer(folder / "tokenizer.json", bos_id=bos_id, eos_id=eos_id)


def _special_ids(folder: Path) -> tuple[int | None, int | None]:
    import json

    config_path = folder / "config.json"
    if not config_path.is_file():
        return None, None
    config = json.loads(config_path.read_text())
    eos = config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    return config.get("bos_token_id"), eos
