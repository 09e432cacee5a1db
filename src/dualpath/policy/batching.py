"""Intra-PE batching (paper §6.4): what goes into one prefill forward on one PE.

A request in the ready queue is (cached, remaining): tokens whose KV already exists (hit + chunks
computed) and miss tokens still to compute. A batch item is (cached, bsz): `bsz` new tokens now.
The remainder of a chunked request stays at the queue head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from dualpath.records import fields_equal, fields_key, fields_repr

# Predicted attention time of ONE layer on one GPU for a list of (cached_tokens, new_tokens).
# The simulator passes its cost model's `attention_layer_time_s`; the runtime a fitted one.
AttentionTimeFn = Callable[[Sequence[tuple[int, int]]], float]

# Token budget per forward for modes without the compute quota, like vLLM's
# `max_num_batched_tokens` / SGLang's `--chunked-prefill-size` (SGLang's default is 8192).
DEFAULT_MAX_BATCH_NEW_TOKENS: Final = 8192


_PREFILL_WORK_FIELDS = ("request_id", "cached_tokens", "remaining_tokens")  # slots and repr
_BATCH_ITEM_FIELDS = ("request_id", "cached_tokens", "new_tokens")


class PrefillWork:
    """A ready request as packing sees it. A plain slotted record, not a NamedTuple: a NamedTuple's
    `__new__` stays interpreted in the native build, and every step makes one per request it looks at."""

    __slots__ = _PREFILL_WORK_FIELDS

    def __init__(self, *, request_id: int, cached_tokens: int, remaining_tokens: int) -> None:
        self.request_id = request_id
        self.cached_tokens = cached_tokens
        self.remaining_tokens = remaining_tokens

    def __repr__(self) -> str:
        return fields_repr(self, _PREFILL_WORK_FIELDS)


class BatchItem:
    """One request's share of a forward; compared by value (it is part of a `BatchDecision`)."""

    __slots__ = _BATCH_ITEM_FIELDS

    def __init__(self, *, request_id: int, cached_tokens: int, new_tokens: int) -> None:
        self.request_id = request_id
        self.cached_tokens = cached_tokens
        self.new_tokens = new_tokens  # bsz of §6.4

    def __eq__(self, other: object) -> bool:
        return fields_equal(self, other, _BATCH_ITEM_FIELDS)

    def __hash__(self) -> int:
        return hash(fields_key(self, _BATCH_ITEM_FIELDS))

    def __repr__(self) -> str:
        return fields_repr(self, _BATCH_ITEM_FIELDS)


def pack_by_compute_quota(
    queue: Iterable[PrefillWork], *, attention_time_s: AttentionTimeFn, quota_s: float
) -> list[BatchItem]:
    """FIFO packing while the predicted attention-layer time stays <= quota (§6.4).

    The first request that would overflow runs as a chunked prefill with the largest bsz' that fits
    (binary search; time is monotone in bsz). The batch always makes progress: if even one token of
    the head request overflows an empty batch, that one token runs alone.
    """
    batch: list[BatchItem] = []
    # The batch so far plus the pair being tried: one list, extended and shrunk in place (the predictors
    # read it during the call only), not a copy per probe.
    pairs: list[tuple[int, int]] = []
    for work in queue:
        whole = (work.cached_tokens, work.remaining_tokens)
        pairs.append(whole)
        if attention_time_s(pairs) <= quota_s:
            batch.append(BatchItem(request_id=work.request_id, cached_tokens=whole[0], new_tokens=whole[1]))
            continue
        pairs.pop()
        bsz = largest_fitting_bsz(work, pairs, attention_time_s=attention_time_s, quota_s=quota_s)
        if bsz == 0 and not batch:
            bsz = 1
        if bsz > 0:
            batch.append(
                BatchItem(request_id=work.request_id, cached_tokens=work.cached_tokens, new_tokens=bsz)
            )
        break
    return batch


def largest_fitting_bsz(
    work: PrefillWork, pairs: list[tuple[int, int]], *, attention_time_s: AttentionTimeFn, quota_s: float
) -> int:
    """Binary search for the largest bsz' in [0, remaining) with predicted time <= quota (each probe
    appends its pair to `pairs` and takes it off again: `pairs` is as it was on return)."""
    lo, hi = 0, work.remaining_tokens - 1  # invariant: lo fits (0 trivially), anything > hi overflows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        pairs.append((work.cached_tokens, mid))
        fits = attention_time_s(pairs) <= quota_s
        pairs.pop()
        if fits:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pack_by_token_budget(
    queue: Iterable[PrefillWork], *, max_new_tokens: int, max_kv_tokens: int | None = None
) -> list[BatchItem]:
    """FIFO packing under a new-token budget (modes without the quota: basic, layerwise, dualpath-rr).

    `max_kv_tokens` (basic only) bounds Σ(cached + new): without layerwise loading the whole KV of
    the batch sits in PE HBM during the forward. The request that overflows the new-token budget is
    chunked to the budget left; a request whose KV does not fit stops the batch (FIFO, no skipping),
    except that the head always runs so the queue cannot stall.
    """
    batch: list[BatchItem] = []
    new_left = max_new_tokens
    kv_left = max_kv_tokens
    for work in queue:
        take = min(work.remaining_tokens, new_left)
        if kv_left is not None and work.cached_tokens + take > kv_left and batch:
            break
        if take <= 0:
            break
        batch.append(BatchItem(request_id=work.request_id, cached_tokens=work.cached_tokens, new_tokens=take))
        new_left -= take
        if kv_left is not None:
            kv_left -= work.cached_tokens + take
        if take < work.remaining_tokens or new_left <= 0:
            break
    return batch
