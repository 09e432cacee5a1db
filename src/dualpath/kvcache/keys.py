"""Block keys: a chained hash of token ids per Full Block (paper §4.1: storage is a trie of Full Blocks).

    key_0 = H(ROOT_KEY ‖ tokens of block 0)
    key_i = H(key_{i-1} ‖ tokens of block i)        H = blake2b, 16-byte digest

Because each key folds in its parent, a key names the whole prefix that ends with its block: the identity of a
prefix is its last block key, and two sequences share key_i exactly when their first i+1 blocks are equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

BlockKey = bytes
KEY_BYTES = 16  # 128-bit digest: collisions are negligible for any realistic number of blocks
ROOT_KEY: BlockKey = bytes(KEY_BYTES)  # parent of the first block of every sequence


def block_keys(token_ids: Sequence[int], block_tokens: int, *, parent: BlockKey = ROOT_KEY) -> list[BlockKey]:
    """Keys of the whole blocks of `token_ids`; a trailing partial block has no key (it is never cached).

    `parent` continues an earlier chain: block_keys(a + b, n) == block_keys(a, n) + block_keys(b, n, parent=...)
    when len(a) is a multiple of n.
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    tokens = np.asarray(token_ids, dtype="<i8")
    keys: list[BlockKey] = []
    prev = parent
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        h = hashlib.blake2b(prev, digest_size=KEY_BYTES)
        h.update(tokens[start : start + block_tokens].tobytes())
        prev = h.digest()
        keys.append(prev)
    return keys


def key_hex(key: BlockKey) -> str:
    """The key as 32 hex characters (the Full Block's file name)."""
    return key.hex()


def key_from_hex(text: str) -> BlockKey:
    key = bytes.fromhex(text)
    if len(key) != KEY_BYTES:
        raise ValueError(f"a block key has {KEY_BYTES} bytes, got {len(key)} from {text!r}")
    return key
