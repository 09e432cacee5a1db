"""Prefill engines (PEs) of one node, lock-stepped as one DP-attention / EP-MoE group (paper §6.4).

A PE's ready queue holds requests whose hit KV is in a DRAM buffer and whose DE buffer landing space
is reserved: exactly the prefillable ones, in FIFO order. A node runs one forward at a time across
its g engines; an engine with nothing ready still joins the step (EP needs every rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath.engine.commands import StepItem
from dualpath.policy.fifo import Fifo
from dualpath.request import Request


@dataclass
class PrefillEngine:
    engine_id: int
    node_id: int
    ready: Fifo[Request] = field(default_factory=Fifo)
    seq: int = 0  # unfinished requests assigned here (§6.1 seq_e)
    tok: int = 0  # their prompt tokens (§6.1 tok_e)
    compute_tok: int = 0  # their miss tokens: the GPU work β bounds (policy/pe_assign.py)

    def assign(self, request: Request) -> None:
        self.seq += 1
        self.tok += request.prompt_tokens
        self.compute_tok += request.miss_tokens

    def grow_miss(self, tokens: int) -> None:
        """An assigned request's hit shrank by `tokens` (a lost block): it computes them too."""
        self.compute_tok += tokens

    def finish(self, request: Request) -> None:
        self.seq -= 1
        self.tok -= request.prompt_tokens
        self.compute_tok -= request.miss_tokens


@dataclass
class PrefillNode:
    node_id: int
    engines: list[PrefillEngine]
    step_id: int = 0
    busy: bool = False
    running: tuple[tuple[StepItem, ...], ...] = ()
    awaiting_out: dict[int, tuple[StepItem, ...]] = field(default_factory=dict)  # step -> finished items

    @property
    def has_ready(self) -> bool:
        return any(e.ready for e in self.engines)


def step_item(request: Request, pe_engine: int, cached_tokens: int, new_tokens: int) -> StepItem:
    """Tokens each hop moves for one request's chunk (all layers together).

    First chunk: PE-side hit from the PE buffer, DE-side hit from the DE buffer; out = the PE-side hit
    (it must reach the DE, Fig. 4a steps 5-7) + the new KV. Later chunks also reload the earlier
    chunks' KV, which by then lives in the DE buffer; out = the new KV only.
    """
    first = request.computed_tokens == 0
    # A hit that shrank after its reads (a lost block) loads only its usable rows.
    pe_hit = min(request.pe_read_tokens, request.hit_tokens)
    de_hit = min(request.de_read_tokens, request.hit_tokens - pe_hit)
    assert request.de_engine is not None  # placed on a DE before any prefill
    return StepItem(
        request_id=request.request_id,
        pe_engine=pe_engine,
        de_engine=request.de_engine,
        hit_tokens=request.hit_tokens,
        pe_read_tokens=request.pe_read_tokens,
        de_read_tokens=request.de_read_tokens,
        gen_tokens=request.gen_tokens,
        cached_tokens=cached_tokens,
        new_tokens=new_tokens,
        load_pe_tokens=pe_hit,
        load_de_tokens=de_hit + request.computed_tokens,
        out_tokens=new_tokens + (pe_hit if first else 0),
        completes_prefill=new_tokens >= request.remaining_prefill_tokens,
    )
