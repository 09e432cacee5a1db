"""Commands the core hands to its driver (frozen). The driver executes them and reports back.

A command carries plain values only: ids, token counts, token ranges (as a vLLM scheduler output
does), never the core's own `Request`, which the core goes on changing. A driver that needs more of a
request's state asks the core (`ClusterCore.view`, `decode_joiners`, `decode_batch`) and gets a copy.

StartRead       storage -> node SNIC -> node DRAM        -> core.on_read_done(node, request_id)
StartPrefillStep one lock-stepped forward of a PE node   -> core.on_prefill_step_done(node, step)
                                                           core.on_kv_out_done(node, step)
StartH2D        DE DRAM -> DE CNIC (loopback) -> DE HBM  -> core.on_h2d_done(request_id)
StartPersist    [DE HBM -> CNIC ->] DRAM -> SNIC -> storage -> core.on_persist_done(request_id, from_hbm)
DecodeChanged   a request joins a DE node's batch: idle, core.start_decode_run(node); running,
                cut at the next step boundary if core.decode_cut_wanted(node)
TokenMilestone  token 1 (prefill end), 2 (first decode step) and the last one were produced
RequestDone     the request finished and its KV is persisted: the agent may send its next round

NOTE: plain slotted classes built by keyword and never changed after, not frozen dataclasses or
NamedTuples: the simulator builds several per event. A frozen dataclass's `__init__` took ≈14 % of its
CPU (one `object.__setattr__` per field), and in the native build (docs/simulator-native.md) both a
dataclass's generated `__init__` and a NamedTuple's `__new__` stay interpreted, while a class's own
`__init__` compiles to C. They compare by identity; `repr` shows their fields. A command holds plain
values (and a step's list of items), never anything that refers back to it, so it can be in no reference
cycle: `mypyc_attr(acyclic=True)` leaves it out of the cyclic garbage collector, whose tracking and
untracking of every object made and freed is a share of each event's cost (docs/simulator-native.md).
"""

from __future__ import annotations

from typing import ClassVar

from mypy_extensions import mypyc_attr

from dualpath.records import fields_repr
from dualpath.request import Request


@mypyc_attr(acyclic=True)
class _Command:
    """Base of the commands: a readable repr from the fields each class lists in `_fields`."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return fields_repr(self, self._fields)


@mypyc_attr(acyclic=True)
class StartRead(_Command):
    """Read the request's hit tokens [start_tokens, start_tokens + tokens) from storage on `node_id`
    (its PE-side part, or the DE-side part of a split read, §5)."""

    _fields = ("node_id", "request_id", "start_tokens", "tokens", "prompt_tokens", "pe_side")
    __slots__ = _fields

    def __init__(
        self,
        *,
        node_id: int,
        request_id: int,
        start_tokens: int,
        tokens: int,
        prompt_tokens: int,
        pe_side: bool,
    ) -> None:
        self.node_id = node_id
        self.request_id = request_id
        self.start_tokens = start_tokens
        self.tokens = tokens
        self.prompt_tokens = prompt_tokens
        self.pe_side = pe_side  # False: read by the request's DE node, forwarded over the CNICs


@mypyc_attr(acyclic=True)
class StepItem(_Command):
    """One request's share of a PE forward, with the tokens each hop moves (per all layers).

    Sources of the KV loaded into PE HBM: `load_pe_tokens` from the PE buffer (PE CNIC loopback),
    `load_de_tokens` from the DE buffer (DE CNIC => PE CNIC). `out_tokens` go PE HBM => DE buffer.
    `hit_tokens` is the usable hit (shrunk if a read lost a block); `pe_read_tokens` / `de_read_tokens`
    the hit each side read; `gen_tokens` its output length.
    """

    _fields = (
        "request_id",
        "pe_engine",
        "de_engine",
        "hit_tokens",
        "pe_read_tokens",
        "de_read_tokens",
        "gen_tokens",
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
        request_id: int,
        pe_engine: int,
        de_engine: int,
        hit_tokens: int,
        pe_read_tokens: int,
        de_read_tokens: int,
        gen_tokens: int,
        cached_tokens: int,
        new_tokens: int,
        load_pe_tokens: int,
        load_de_tokens: int,
        out_tokens: int,
        completes_prefill: bool,
    ) -> None:
        self.request_id = request_id
        self.pe_engine = pe_engine
        self.de_engine = de_engine
        self.hit_tokens = hit_tokens
        self.pe_read_tokens = pe_read_tokens
        self.de_read_tokens = de_read_tokens
        self.gen_tokens = gen_tokens
        self.cached_tokens = cached_tokens
        self.new_tokens = new_tokens
        self.load_pe_tokens = load_pe_tokens
        self.load_de_tokens = load_de_tokens
        self.out_tokens = out_tokens
        self.completes_prefill = completes_prefill


@mypyc_attr(acyclic=True)
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


@mypyc_attr(acyclic=True)
class StartH2D(_Command):
    """The prompt's `tokens` of KV, DE buffer => DE HBM; its first `hit_tokens` came from storage."""

    _fields = ("de_engine", "request_id", "tokens", "hit_tokens")
    __slots__ = _fields

    def __init__(self, *, de_engine: int, request_id: int, tokens: int, hit_tokens: int) -> None:
        self.de_engine = de_engine
        self.request_id = request_id
        self.tokens = tokens
        self.hit_tokens = hit_tokens


@mypyc_attr(acyclic=True)
class StartPersist(_Command):
    """Write the Full Blocks of tokens [start_tokens, start_tokens + tokens) to storage."""

    _fields = ("de_engine", "request_id", "start_tokens", "tokens", "from_hbm")
    __slots__ = _fields

    def __init__(
        self, *, de_engine: int, request_id: int, start_tokens: int, tokens: int, from_hbm: bool
    ) -> None:
        self.de_engine = de_engine
        self.request_id = request_id
        self.start_tokens = start_tokens
        self.tokens = tokens
        # Decode-time block: D2H through the CNIC first; prompt blocks leave DRAM directly.
        self.from_hbm = from_hbm

    @property
    def end_tokens(self) -> int:
        return self.start_tokens + self.tokens


@mypyc_attr(acyclic=True)
class DecodeChanged(_Command):
    _fields = ("node_id",)
    __slots__ = _fields

    def __init__(self, *, node_id: int) -> None:
        self.node_id = node_id


@mypyc_attr(acyclic=True)
class TokenMilestone(_Command):
    _fields = ("request_id", "de_engine", "token_index", "last", "steps_before_now")
    __slots__ = _fields

    def __init__(
        self, *, request_id: int, de_engine: int, token_index: int, last: bool, steps_before_now: int = 0
    ) -> None:
        self.request_id = request_id
        self.de_engine = de_engine
        self.token_index = token_index  # 1, 2, or gen_tokens (the last)
        self.last = last  # the request's last token
        # Decode steps before `now_s` at which the token came out: a driver that runs several decode
        # steps at once learns of a second token late and back-dates it (0: produced now).
        self.steps_before_now = steps_before_now


@mypyc_attr(acyclic=True)
class RequestDone(_Command):
    """What the request ended with: its engines, its usable hit and the part each side read."""

    _fields = ("request_id", "pe_engine", "de_engine", "hit_tokens", "pe_read_tokens", "de_read_tokens")
    __slots__ = _fields

    def __init__(
        self,
        *,
        request_id: int,
        pe_engine: int | None,
        de_engine: int | None,
        hit_tokens: int,
        pe_read_tokens: int,
        de_read_tokens: int,
    ) -> None:
        self.request_id = request_id
        self.pe_engine = pe_engine
        self.de_engine = de_engine
        self.hit_tokens = hit_tokens
        self.pe_read_tokens = pe_read_tokens
        self.de_read_tokens = de_read_tokens


@mypyc_attr(acyclic=True)
class RequestView(_Command):
    """A request as the core has it now (`ClusterCore.view`, the joiners of a decode run, the requests a
    node death re-plans): a copy, so a driver reads the core's state without holding the core's own
    objects. Not a command."""

    _fields = (
        "request_id",
        "trajectory_id",
        "round_index",
        "phase",
        "prompt_tokens",
        "persisted_tokens",
        "pe_engine",
        "de_engine",
        "hit_tokens",
        "pe_read_tokens",
        "de_read_tokens",
        "generated_tokens",
        "gen_tokens",
    )
    __slots__ = _fields

    def __init__(self, request: Request) -> None:
        self.request_id = request.request_id
        self.trajectory_id = request.trajectory_id
        self.round_index = request.round_index
        self.phase = request.phase
        self.prompt_tokens = request.prompt_tokens
        self.persisted_tokens = request.persisted_tokens  # its prefix whose KV is in storage
        self.pe_engine = request.pe_engine
        self.de_engine = request.de_engine
        self.hit_tokens = request.hit_tokens
        self.pe_read_tokens = request.pe_read_tokens
        self.de_read_tokens = request.de_read_tokens
        self.generated_tokens = request.generated_tokens
        self.gen_tokens = request.gen_tokens


Command = (
    StartRead | StartPrefillStep | StartH2D | StartPersist | DecodeChanged | TokenMilestone | RequestDone
)
