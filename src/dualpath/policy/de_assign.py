"""DE assignment in two phases (paper §6.2): global queue -> DE groups, then within a group.

len_r = prompt + output tokens (`Request.total_tokens`): the HBM the request holds at its end. The
scheduler reserves it when the request is placed on a DE, so decode never preempts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

from mypy_extensions import i64, mypyc_attr

from dualpath.policy.fifo import Fifo
from dualpath.records import fields_repr
from dualpath.request import Request

_DE_CANDIDATE_FIELDS = ("engine_id", "node_id", "seq", "tok", "free_hbm_tokens")  # slots and repr


class DeCandidate:
    """Scheduler-side view of one DE during a fetch; counts change as requests are placed.

    NOTE: a plain class with its own `__init__`, not a dataclass: in the native build a dataclass's
    generated `__init__` stays interpreted, and every fetch builds one of these per engine.
    """

    __slots__ = _DE_CANDIDATE_FIELDS

    def __init__(self, *, engine_id: int, node_id: int, seq: int, tok: int, free_hbm_tokens: int) -> None:
        self.engine_id = engine_id
        self.node_id = node_id
        self.seq = seq
        self.tok = tok
        self.free_hbm_tokens = free_hbm_tokens

    def __repr__(self) -> str:
        return fields_repr(self, _DE_CANDIDATE_FIELDS)


@final
@mypyc_attr(acyclic=True)  # plain numbers: in no reference cycle
class _GroupTok:
    """One DE group in `GroupTokens`: its node id, its Σtok and its place in the heap."""

    __slots__ = ("node_id", "tok", "pos")

    def __init__(self, node_id: i64, pos: i64) -> None:
        self.node_id = node_id
        self.tok: i64 = 0
        self.pos = pos


def _smaller(a: _GroupTok, b: _GroupTok) -> bool:
    """`(a.tok, a.node_id) < (b.tok, b.node_id)`: phase 1's order (smallest Σtok, then lowest id)."""
    if a.tok != b.tok:
        return a.tok < b.tok
    return a.node_id < b.node_id


class GroupTokens:
    """Σtok per DE group (the scheduler's view: each group's last report plus what was routed to it since),
    with the group phase 1 picks next at hand: the smallest Σtok, then the lowest id.

    NOTE: an indexed heap of the groups, each moving in place when its Σtok changes (O(log groups));
    phase 1 reads its top. Phase 1 runs at every DE fetch that finds the global queue non-empty, once
    per request of it; a scan of every group's Σtok there costs O(groups) per request (96 DE groups at
    48P96D, where such scans took 6 % of the run: benchmarks/README.md). Its sifts are its own, as
    the kernel's and the fill's are: each heap compares its own type's fields unboxed, where a shared
    generic one would compare through the generic comparison.
    """

    def __init__(self, node_ids: Sequence[int]) -> None:
        if len(set(node_ids)) != len(node_ids) or min(node_ids, default=0) < 0:
            raise ValueError(f"DE group ids must be distinct and >= 0, got {list(node_ids)}")
        order = sorted(node_ids)  # all Σtok 0: in id order, a heap already
        self._heap = [_GroupTok(node_id, pos) for pos, node_id in enumerate(order)]
        self._by_node: list[_GroupTok | None] = [None] * (order[-1] + 1 if order else 0)
        for group in self._heap:
            self._by_node[group.node_id] = group

    def _group(self, node_id: int) -> _GroupTok:
        group = self._by_node[node_id] if 0 <= node_id < len(self._by_node) else None
        if group is None:
            raise KeyError(f"no DE group {node_id}")
        return group

    def __getitem__(self, node_id: int) -> int:
        return self._group(node_id).tok

    def __setitem__(self, node_id: int, tok: int) -> None:
        group = self._group(node_id)
        if group.tok == tok:
            return
        group.tok = tok
        heap = self._heap
        pos = group.pos
        if pos > 0 and _smaller(group, heap[(pos - 1) >> 1]):
            _sift_up(heap, pos, group)
        else:
            _sift_down(heap, pos, group)

    def smallest(self) -> int:
        """The id of the group with the smallest Σtok (the lowest id on a tie)."""
        if not self._heap:
            raise ValueError("no DE group to route to")
        return self._heap[0].node_id


def _sift_up(heap: list[_GroupTok], pos: i64, group: _GroupTok) -> None:
    """Put `group` at `pos` or above it, moving the later parents down (each keeps its `pos`)."""
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not _smaller(group, parent):
            break
        heap[pos] = parent
        parent.pos = pos
        pos = parent_pos
    heap[pos] = group
    group.pos = pos


def _sift_down(heap: list[_GroupTok], pos: i64, group: _GroupTok) -> None:
    """Put `group` at `pos` or below it, moving the earlier children up (each keeps its `pos`)."""
    end: i64 = len(heap)
    while True:
        child = 2 * pos + 1
        if child >= end:
            break
        right = child + 1
        if right < end and _smaller(heap[right], heap[child]):
            child = right
        if not _smaller(heap[child], group):
            break
        moved = heap[child]
        heap[pos] = moved
        moved.pos = pos
        pos = child
    heap[pos] = group
    group.pos = pos


def route_to_de_groups(requests: Sequence[Request], tok: GroupTokens) -> list[tuple[int, int]]:
    """Phase 1: each request goes to the group with the smallest Σtok (then lowest group id), whose Σtok
    grows by the request's len_r at once (in `tok`), so a burst spreads over the groups."""
    out: list[tuple[int, int]] = []
    for request in requests:
        group = tok.smallest()
        tok[group] = tok[group] + request.total_tokens
        out.append((request.request_id, group))
    return out


def assign_within_de_group(
    private_queue: Fifo[Request], candidates: list[DeCandidate], *, z_factor: float
) -> list[tuple[int, int]]:
    """Phase 2: place the head of the group's private queue on DEs until one does not fit.

    R = the longest head prefix whose Σ len_r fits the group's Σ free HBM (fragmentation ignored);
    Z = z_factor × (Σ_R len_r + Σ_E tok_e) / |E|. For the head request: among DEs with room, a DE is
    high-token if tok_e + len_r > Z; prefer a non-high-token DE with min seq (then min tok), else the
    high-token DE with min tok. End the fetch when no DE has room for the head.
    """
    if not candidates:
        return []
    # `candidates` is a list and these are loops, not sum() over generators: the native build iterates a
    # list directly, a Sequence or a generator through the iterator protocol (this runs per fetch).
    free_total = 0
    group_tok = 0
    for e in candidates:
        free_total += e.free_hbm_tokens
        group_tok += e.tok
    prefix: list[Request] = []
    used = 0
    for k in range(len(private_queue)):  # the head prefix: no iterator over a long queue
        request = private_queue.at(k)
        if used + request.total_tokens > free_total:
            break
        used += request.total_tokens
        prefix.append(request)
    z = z_factor * (used + group_tok) / len(candidates)
    out: list[tuple[int, int]] = []
    for request in prefix:
        de = choose_decode_engine(request.total_tokens, candidates, z_tokens=z)
        if de is None:
            break
        de.free_hbm_tokens -= request.total_tokens
        de.tok += request.total_tokens
        de.seq += 1
        out.append((request.request_id, de.engine_id))
    return out


def choose_decode_engine(
    len_tokens: int, candidates: list[DeCandidate], *, z_tokens: float
) -> DeCandidate | None:
    """Among DEs with room: the non-high-token one with min (seq, tok, id), else the min (tok, id).

    One pass with plain comparisons (no lists, keys or tuples per candidate: it runs per placement)."""
    best_normal: DeCandidate | None = None  # fits, tok_e + len_r <= Z: min (seq, tok, engine_id)
    best_fit: DeCandidate | None = None  # fits: min (tok, engine_id)
    for e in candidates:
        if e.free_hbm_tokens < len_tokens:
            continue
        if (
            best_fit is None
            or e.tok < best_fit.tok
            or (e.tok == best_fit.tok and e.engine_id < best_fit.engine_id)
        ):
            best_fit = e
        if e.tok + len_tokens <= z_tokens and (best_normal is None or _fewer_seq_first(e, best_normal)):
            best_normal = e
    return best_normal if best_normal is not None else best_fit


def _fewer_seq_first(a: DeCandidate, b: DeCandidate) -> bool:
    """(a.seq, a.tok, a.engine_id) < (b.seq, b.tok, b.engine_id)."""
    if a.seq != b.seq:
        return a.seq < b.seq
    if a.tok != b.tok:
        return a.tok < b.tok
    return a.engine_id < b.engine_id
