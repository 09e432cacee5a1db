"""Commands the core hands to its driver (frozen). The driver executes them and reports back.

StartRead       storage -> node SNIC -> node DRAM        -> core.on_read_done(node, request)
StartPrefillStep one lock-stepped forward of a PE node   -> core.on_prefill_step_done(node, step)
                                                           core.on_kv_out_done(node, step)
StartH2D        DE DRAM -> DE CNIC (loopback) -> DE HBM  -> core.on_h2d_done(request)
StartPersist    [DE HBM -> CNIC ->] DRAM -> SNIC -> storage -> core.on_persist_done(request, tokens)
DecodeChanged   a request joins a DE node's batch: idle, core.start_decode_run(node); running,
                cut at the next step boundary if core.decode_cut_wanted(node)
TokenMilestone  token 1 (prefill end), 2 (first decode step) and the last one were produced
RequestDone     the request finished and its KV is persisted: the agent may send its next round

NOTE: plain slotted classes built by keyword and never changed after, not frozen dataclasses or
NamedTuples: the simulator builds several per event. A frozen dataclass's `__init__` took ≈14 % of its
CPU (one `object.__setattr__` per field), and in the native build (docs/simulator-native.md) both a
dataclass's generated `__init__` and a NamedTuple's `__new__` stay interpreted, while a class's own
`__init__` compiles to C. They compare by identity; `repr` shows their fields.
"""

from __future__ import annotations

from typing import ClassVar

from dualpath.records import fields_repr
from dualpath.request import Request


class _Command:
    """Base of the commands: a readable repr from the fields each class lists in `_fields`."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return fields_repr(self, self._fields)


class StartRead(_Command):
    _fields = ("node_id", "request", "tokens")
    __slots__ = _fields

    def __init__(self, *, node_id: int, request: Request, tokens: int) -> None:
        self.node_id = node_id
        self.request = request
        self.tokens = tokens


class StepItem(_Command):
    """One request's share of a PE forward, with the tokens each hop moves (per all layers).

    Sources of the KV loaded into PE HBM: `load_pe_tokens` from the PE buffer (PE CNIC loopback),
    `load_de_tokens` from the DE buffer (DE CNIC => PE CNIC). `out_tokens` go PE HBM => DE buffer.
    """

    _fields = (
        "request",
        "pe_engine",
        "cached_tokens",
        "new_tokens",
        "load_pe_tokens",
        "load_de_tokens",
        "out_tokens",
        "completes_prefill",
    )
    __slots__ = _fields

    def __init__(
        self,
        *,
        request: Request,
        pe_engine: int,
        cached_tokens: int,
        new_tokens: int,
        load_pe_tokens: int,
        load_de_tokens: int,
        out_tokens: int,
        completes_prefill: bool,
    ) -> None:
        self.request = request
        self.pe_engine = pe_engine
        self.cached_tokens = cached_tokens
        self.new_tokens = new_tokens
        self.load_pe_tokens = load_pe_tokens
        self.load_de_tokens = load_de_tokens
        self.out_tokens = out_tokens
        self.completes_prefill = completes_prefill


class StartPrefillStep(_Command):
    _fields = ("node_id", "step_id", "layerwise", "batches")
    __slots__ = _fields

    def __init__(
        self, *, node_id: int, step_id: int, layerwise: bool, batches: tuple[tuple[StepItem, ...], ...]
    ) -> None:
        self.node_id = node_id
        self.step_id = step_id
        self.layerwise = layerwise
        self.batches = batches  # one tuple per engine of the node (may be empty)


class StartH2D(_Command):
    _fields = ("de_engine", "request", "tokens")
    __slots__ = _fields

    def __init__(self, *, de_engine: int, request: Request, tokens: int) -> None:
        self.de_engine = de_engine
        self.request = request
        self.tokens = tokens


class StartPersist(_Command):
    _fields = ("de_engine", "request", "tokens", "from_hbm")
    __slots__ = _fields

    def __init__(self, *, de_engine: int, request: Request, tokens: int, from_hbm: bool) -> None:
        self.de_engine = de_engine
        self.request = request
        self.tokens = tokens
        # Decode-time block: D2H through the CNIC first; prompt blocks leave DRAM directly.
        self.from_hbm = from_hbm


class DecodeChanged(_Command):
    _fields = ("node_id",)
    __slots__ = _fields

    def __init__(self, *, node_id: int) -> None:
        self.node_id = node_id


class TokenMilestone(_Command):
    _fields = ("request", "token_index", "steps_before_now")
    __slots__ = _fields

    def __init__(self, *, request: Request, token_index: int, steps_before_now: int = 0) -> None:
        self.request = request
        self.token_index = token_index  # 1, 2, or gen_tokens (the last)
        # Decode steps before `now_s` at which the token came out: a driver that runs several decode
        # steps at once learns of a second token late and back-dates it (0: produced now).
        self.steps_before_now = steps_before_now


class RequestDone(_Command):
    _fields = ("request",)
    __slots__ = _fields

    def __init__(self, *, request: Request) -> None:
        self.request = request


Command = (
    StartRead | StartPrefillStep | StartH2D | StartPersist | DecodeChanged | TokenMilestone | RequestDone
)
