"""DE assignment in two phases (paper §6.2): global queue -> DE groups, then within a group.

len_r = prompt + output tokens (`Request.total_tokens`): the HBM the request holds at its end. The
scheduler reserves it when the request is placed on a DE, so decode never preempts.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def route_to_de_groups(
    requests: Sequence[Request], groups: list[int], tok_by_group: Sequence[int]
) -> list[tuple[int, int]]:
    """Phase 1: each request goes to the group with the smallest Σtok (then lowest group id).

    `groups`: the DE groups' ids, in any order; `tok_by_group[g]`: group g's Σtok (a list indexed by
    id, read for the ids in `groups` only). Σtok grows by len_r as requests are routed, so a burst
    spreads over the groups: each request scans the groups' Σtok as the requests before it left them.

    NOTE: O(groups) per request, in plain int compares. It runs at every DE fetch that finds the
    global queue non-empty, mostly with one to a few requests; a heap of (Σtok, id) tuples, O(log
    groups) per request, made a tuple per group at every call and compared them through the generic
    comparison (96 DE groups at 48P96D: 6 % of that run's time, benchmarks/README.md).
    """
    tok = [tok_by_group[group] for group in groups]  # as the requests routed so far leave them
    out: list[tuple[int, int]] = []
    for request in requests:
        best, best_group, best_tok = -1, -1, 0
        for i in range(len(groups)):
            group, group_tok = groups[i], tok[i]
            if best < 0 or group_tok < best_tok or (group_tok == best_tok and group < best_group):
                best, best_group, best_tok = i, group, group_tok
        tok[best] = best_tok + request.total_tokens
        out.append((request.request_id, best_group))
    return out


def assign_within_de_group(
    private_queue: Sequence[Request], candidates: list[DeCandidate], *, z_factor: float
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
    for request in private_queue:
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
