"""Commands the core hands to its driver (frozen). The driver executes them and reports back.

StartRead       storage -> node SNIC -> node DRAM        -> core.on_read_done(node, request)
StartPrefillStep one lock-stepped forward of a PE node   -> core.on_prefill_step_done(node, step)
                                                           core.on_kv_out_done(node, step)
StartH2D        DE DRAM -> DE CNIC (loopback) -> DE HBM  -> core.on_h2d_done(request)
StartPersist    [DE HBM -> CNIC ->] DRAM -> SNIC -> storage -> core.on_persist_done(request, tokens)
DecodeChanged   a DE node's running batch changed: re-time its decode steps
TokenMilestone  token 1 (prefill end), 2 (first decode step) and the last one were produced
RequestDone     the request finished and its KV is persisted: the agent may send its next round

NOTE: immutable NamedTuples built by keyword, not frozen dataclasses: the simulator builds several per
event (≈14 % of its CPU went to frozen-dataclass `__init__`), and a tuple's constructor is ~4× cheaper.
Compare them only with their own type (tuples of different types with equal fields compare equal).
"""

from __future__ import annotations

from typing import NamedTuple

from dualpath.request import Request


class StartRead(NamedTuple):
    node_id: int
    request: Request
    tokens: int


class StepItem(NamedTuple):
    """One request's share of a PE forward, with the tokens each hop moves (per all layers).

    Sources of the KV loaded into PE HBM: `load_pe_tokens` from the PE buffer (PE CNIC loopback),
    `load_de_tokens` from the DE buffer (DE CNIC => PE CNIC). `out_tokens` go PE HBM => DE buffer.
    """

    request: Request
    pe_engine: int
    cached_tokens: int
    new_tokens: int
    load_pe_tokens: int
    load_de_tokens: int
    out_tokens: int
    completes_prefill: bool


class StartPrefillStep(NamedTuple):
    node_id: int
    step_id: int
    layerwise: bool
    batches: tuple[tuple[StepItem, ...], ...]  # one tuple per engine of the node (may be empty)


class StartH2D(NamedTuple):
    de_engine: int
    request: Request
    tokens: int


class StartPersist(NamedTuple):
    de_engine: int
    request: Request
    tokens: int
    from_hbm: bool  # decode-time block: D2H through the CNIC first; prompt blocks leave DRAM directly


class DecodeChanged(NamedTuple):
    node_id: int


class TokenMilestone(NamedTuple):
    request: Request
    token_index: int  # 1, 2, or gen_tokens (the last)
    # Decode steps before `now_s` at which the token came out: a driver that runs several decode
    # steps at once learns of a second token late and back-dates it (0: produced now).
    steps_before_now: int = 0


class RequestDone(NamedTuple):
    request: Request


Command = (
    StartRead | StartPrefillStep | StartH2D | StartPersist | DecodeChanged | TokenMilestone | RequestDone
)
