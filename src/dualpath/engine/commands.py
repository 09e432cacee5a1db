"""Commands the core hands to its driver (frozen). The driver executes them and reports back.

StartRead       storage -> node SNIC -> node DRAM        -> core.on_read_done(node, request)
StartPrefillStep one lock-stepped forward of a PE node   -> core.on_prefill_step_done(node, step)
                                                           core.on_kv_out_done(node, step)
StartH2D        DE DRAM -> DE CNIC (loopback) -> DE HBM  -> core.on_h2d_done(request)
StartPersist    [DE HBM -> CNIC ->] DRAM -> SNIC -> storage -> core.on_persist_done(request, tokens)
DecodeChanged   a DE node's running batch changed: re-time its decode steps
TokenMilestone  token 1 (prefill end), 2 (first decode step) and the last one were produced
RequestDone     the request finished and its KV is persisted: the agent may send its next round
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.request import Request


@dataclass(frozen=True, kw_only=True)
class StartRead:
    node_id: int
    request: Request
    tokens: int


@dataclass(frozen=True, kw_only=True)
class StepItem:
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


@dataclass(frozen=True, kw_only=True)
class StartPrefillStep:
    node_id: int
    step_id: int
    layerwise: bool
    batches: tuple[tuple[StepItem, ...], ...]  # one tuple per engine of the node (may be empty)


@dataclass(frozen=True, kw_only=True)
class StartH2D:
    de_engine: int
    request: Request
    tokens: int


@dataclass(frozen=True, kw_only=True)
class StartPersist:
    de_engine: int
    request: Request
    tokens: int
    from_hbm: bool  # decode-time block: D2H through the CNIC first; prompt blocks leave DRAM directly


@dataclass(frozen=True, kw_only=True)
class DecodeChanged:
    node_id: int


@dataclass(frozen=True, kw_only=True)
class TokenMilestone:
    request: Request
    token_index: int  # 1, 2, or gen_tokens (the last)
    # Decode steps before `now_s` at which the token came out: a driver that runs several decode
    # steps at once learns of a second token late and back-dates it (0: produced now).
    steps_before_now: int = 0


@dataclass(frozen=True, kw_only=True)
class RequestDone:
    request: Request


Command = (
    StartRead | StartPrefillStep | StartH2D | StartPersist | DecodeChanged | TokenMilestone | RequestDone
)
