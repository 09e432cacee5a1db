"""Scheduler-side bookkeeping of the connector, without vLLM: which Full Blocks a request loads, which it persists.

    prompt tokens  |  Full Block 0 | Full Block 1 | ... | Full Block h-1 | rest (computed by vLLM)
                   '------------- hit in the store (h blocks) ---------'
    one Full Block = m vLLM blocks (m = full_block_vllm_blocks); keys chain as in dualpath.kvcache.keys

A hit never covers the prompt's last token: vLLM must compute at least one token to sample the next. A request
persists each Full Block once all its tokens' KV exists (paper §3: new Full Blocks go to storage), so the next
round of an agentic trajectory finds its whole history as a hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dualpath.kvcache import BlockKey, block_keys
from dualpath.kvcache.keys import ROOT_KEY


@dataclass(frozen=True, kw_only=True)
class BlockSpan:
    """One Full Block and the vLLM block ids that hold its tokens in the paged cache."""

    key: BlockKey
    parent: BlockKey
    vllm_block_ids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    request_id: str
    read_path: str  # "pe": this instance reads; "de": the decode-side endpoint reads and forwards
    de_endpoint: str
    blocks: tuple[BlockSpan, ...]
    tokens: int


@dataclass(frozen=True, kw_only=True)
class SaveSpec:
    request_id: str
    blocks: tuple[BlockSpan, ...]


@dataclass
class RequestTrack:
    """What the scheduler side remembers of a running request: its key chain and how far it is persisted."""

    keys: list[BlockKey] = field(default_factory=list)
    persisted_blocks: int = 0


def hit_blocks(
    prompt_token_ids: Sequence[int], full_block_tokens: int, contains: object, *, start_block: int = 0
) -> tuple[list[BlockKey], int]:
    """Keys of the prompt's loadable Full Blocks and how many leading ones the store holds.

    `contains(key) -> bool` is the store's lookup (no LRU touch: vLLM may ask several times per request)."""
    loadable = max(0, (len(prompt_token_ids) - 1) // full_block_tokens)
    keys = block_keys(list(prompt_token_ids[: loadable * full_block_tokens]), full_block_tokens)
    n = start_block
    while n < len(keys) and contains(keys[n]):  # type: ignore[operator]
        n += 1
    return keys, n


def spans(
    keys: Sequence[BlockKey], first: int, stop: int, vllm_block_ids: Sequence[int], per_full_block: int
) -> tuple[BlockSpan, ...]:
    """Full Blocks [first, stop) of a request with the vLLM blocks behind each."""
    out = []
    for j in range(first, stop):
        ids = tuple(vllm_block_ids[j * per_full_block : (j + 1) * per_full_block])
        if len(ids) != per_full_block:
            raise ValueError(f"Full Block {j} needs {per_full_block} vLLM blocks, the request has {len(ids)}")
        out.append(BlockSpan(key=keys[j], parent=keys[j - 1] if j else ROOT_KEY, vllm_block_ids=ids))
    return tuple(out)


def extend_keys(
    track: RequestTrack, token_ids: Sequence[int], full_blocks: int, full_block_tokens: int
) -> None:
    """Grow the request's key chain to `full_blocks` keys (incremental: earlier keys are reused)."""
    have = len(track.keys)
    if full_blocks <= have:
        return
    parent = track.keys[-1] if track.keys else ROOT_KEY
    chunk = list(token_ids[have * full_block_tokens : full_blocks * full_block_tokens])
    track.keys.extend(block_keys(chunk, full_block_tokens, parent=parent))


def blocks_to_persist(
    track: RequestTrack,
    token_ids: Sequence[int],
    tokens_with_kv: int,
    vllm_block_ids: Sequence[int],
    per_full_block: int,
    full_block_tokens: int,
) -> tuple[BlockSpan, ...]:
    """Full Blocks complete once `tokens_with_kv` tokens have KV and not persisted yet; advances the track.

    Only tokens whose ids are known count (with asynchronous scheduling the newest id may still be pending)."""
    complete = min(tokens_with_kv, len(token_ids)) // full_block_tokens
    complete = min(complete, len(vllm_block_ids) // per_full_block)
    if complete <= track.persisted_blocks:
        return ()
    extend_keys(track, token_ids, complete, full_block_tokens)
    out = spans(track.keys, track.persisted_blocks, complete, vllm_block_ids, per_full_block)
    track.persisted_blocks = complete
    return out
