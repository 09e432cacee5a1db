"""PE assignment: Algorithm 1 of the paper (§6.1, Fig. 5).

NOTE: Algorithm 1 as printed computes C1/C2/C3 once per fetch; whether an engine that crosses β
mid-fetch leaves C2/C3 is open (paper summary §13). We recompute the classes after every assignment
(an engine whose `tok` crossed β joins C1), because otherwise one fetch could hand an entire offline
burst to the fetching group, which is what β exists to prevent.

tokens(r) = r.prompt_tokens: tokens proxy GPU, disk and network load (§6.1), and the prompt is what
the PE processes (hit KV loaded, miss KV computed); argmin tok_e picks the least loaded engine.

β bounds GPU work, so the overload test (C1) counts the tokens an engine still has to *compute*
(`compute_tok`: miss tokens of its unfinished requests), and β is the miss tokens one GPU computes in
5 s (A.4: "tokens one GPU processes in 5 s"). The disk side of the load is α's: the node read queue.
Counting prompt tokens against β would weigh a 7K-token prompt with no hit like a 7K-token prompt with
6.9K hits (DeepSeek-V3.2 on Hopper, cost model: a forward of 0.97 s against 0.046 s, most of it fixed
per-forward cost): an offline burst of first rounds, all misses, would then fit under one group's β
and go to a single PE node (docs/core.md §3).
"""

from __future__ import annotations

from collections.abc import Sequence

from dualpath.records import fields_repr
from dualpath.request import Request

_PE_CANDIDATE_FIELDS = ("engine_id", "node_id", "tok", "compute_tok", "read_q_tokens")  # slots and repr


class PeCandidate:
    """Scheduler-side view of one PE during a fetch; `tok` and `read_q_tokens` grow as it assigns.

    A plain class for the native build's sake (see `DeCandidate`).
    """

    __slots__ = _PE_CANDIDATE_FIELDS

    def __init__(
        self, *, engine_id: int, node_id: int, tok: int, compute_tok: int, read_q_tokens: int
    ) -> None:
        self.engine_id = engine_id
        self.node_id = node_id
        self.tok = tok
        self.compute_tok = compute_tok  # miss tokens of its unfinished requests: the GPU work β bounds
        self.read_q_tokens = read_q_tokens

    def __repr__(self) -> str:
        return fields_repr(self, _PE_CANDIDATE_FIELDS)

    def take(self, request: Request) -> None:
        """`request` assigned here this fetch: its tokens(r) and its miss tokens, kept together."""
        self.tok += tokens_of(request)
        self.compute_tok += compute_tokens_of(request)


def tokens_of(request: Request) -> int:
    """tokens(r) of Algorithm 1."""
    return request.prompt_tokens


def compute_tokens_of(request: Request) -> int:
    """The part of tokens(r) a PE computes (its miss tokens): what counts against β."""
    return request.miss_tokens


def overloaded(compute_tok: int, beta_tokens: float) -> bool:
    """Algorithm 1's C1: the engine's unfinished GPU work is over β; it takes nothing this fetch."""
    return compute_tok > beta_tokens


def choose_prefill_engine(
    candidates: list[PeCandidate], *, alpha_tokens: float, beta_tokens: float
) -> PeCandidate | None:
    """One iteration of Algorithm 1: C2 by min tok, else C3 by min tok, else None (C1 never).

    C1 = {compute_tok > β}; C2 = {compute_tok <= β and read_q <= α}: preferred so a short-queue node keeps its SNIC busy (§6.1).
    Ties break on engine id, so the choice is deterministic.
    """
    best_c2: PeCandidate | None = None
    best_c3: PeCandidate | None = None
    for e in candidates:
        if overloaded(e.compute_tok, beta_tokens):
            continue  # C1
        if e.read_q_tokens <= alpha_tokens:
            if best_c2 is None or _less_loaded(e, best_c2):
                best_c2 = e
        elif best_c3 is None or _less_loaded(e, best_c3):
            best_c3 = e
    return best_c2 if best_c2 is not None else best_c3


def _less_loaded(a: PeCandidate, b: PeCandidate) -> bool:
    """(a.tok, a.engine_id) < (b.tok, b.engine_id), without building the tuples (per candidate, per pick)."""
    return a.tok < b.tok or (a.tok == b.tok and a.engine_id < b.engine_id)


def assign_prefill_engines(
    queue: Sequence[Request], candidates: list[PeCandidate], *, alpha_tokens: float, beta_tokens: float
) -> list[tuple[int, int]]:
    """Algorithm 1 over a FIFO queue: [(request_id, engine_id)] in assignment order.

    Stops at the first request no engine can take (C2 and C3 empty). Read queues are not changed
    here; `RequestScheduler` also adds the read side's tokens as it goes.
    """
    out: list[tuple[int, int]] = []
    for request in queue:
        pe = choose_prefill_engine(candidates, alpha_tokens=alpha_tokens, beta_tokens=beta_tokens)
        if pe is None:
            break
        pe.take(request)
        out.append((request.request_id, pe.engine_id))
    return out
