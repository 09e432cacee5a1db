"""Small value types the policies exchange (read-only by convention; no behaviour beyond derived values)."""

from __future__ import annotations

import enum

from dualpath.records import fields_equal, fields_key, fields_repr

# Each record's fields, once: its slots and its repr.
_ENGINE_LOAD_FIELDS = (
    "engine_id",
    "node_id",
    "seq",
    "tok",
    "compute_tok",
    "read_q_tokens",
    "free_hbm_tokens",
)
_NODE_READ_STATE_FIELDS = ("read_q_tokens", "read_tokens_per_s")
_READ_PLAN_FIELDS = ("pe_read_tokens", "de_read_tokens")


class ReadSide(enum.Enum):
    """Which node's SNIC reads a request's hit KV (paper §4.1, Fig. 4)."""

    PE = "pe_read"
    DE = "de_read"


class EngineLoad:
    """What an engine reports at a group fetch (paper §6.1).

    `tok` counts prompt tokens of unfinished requests on a PE and `len_r` (prompt + output) of
    unfinished requests on a DE; `compute_tok` (PEs only) counts the miss tokens of a PE's unfinished
    requests, the GPU work β bounds (docs/core.md §3); `read_q_tokens` is the hit tokens waiting to be
    read (queued or in flight) on the engine's node SNIC; `free_hbm_tokens` is used for DEs only.

    NOTE: a plain class, not a NamedTuple: a NamedTuple's `__new__` is interpreted code even in the
    native build, and every fetch builds one report per engine of each group it visits.
    """

    __slots__ = _ENGINE_LOAD_FIELDS

    def __init__(
        self,
        *,
        engine_id: int,
        node_id: int,
        seq: int,
        tok: int,
        compute_tok: int,
        read_q_tokens: int,
        free_hbm_tokens: int = 0,
    ) -> None:
        self.engine_id = engine_id
        self.node_id = node_id
        self.seq = seq
        self.tok = tok
        self.compute_tok = compute_tok
        self.read_q_tokens = read_q_tokens
        self.free_hbm_tokens = free_hbm_tokens

    def __repr__(self) -> str:
        return fields_repr(self, _ENGINE_LOAD_FIELDS)


class NodeReadState:
    """A node's storage read queue as a read-path policy sees it (§6.3).

    A plain slotted class for the native build's sake (see `EngineLoad`): every placement makes two.
    """

    __slots__ = _NODE_READ_STATE_FIELDS

    def __init__(self, read_q_tokens: int, read_tokens_per_s: float) -> None:
        self.read_q_tokens = read_q_tokens
        self.read_tokens_per_s = read_tokens_per_s  # how fast this node's storage path drains its queue

    def __eq__(self, other: object) -> bool:
        return fields_equal(self, other, _NODE_READ_STATE_FIELDS)

    def __hash__(self) -> int:
        return hash(fields_key(self, _NODE_READ_STATE_FIELDS))

    def __repr__(self) -> str:
        return fields_repr(self, _NODE_READ_STATE_FIELDS)


class ReadPlan:
    """How a request's hit tokens are divided between the two read paths (a plain slotted class, as
    `NodeReadState`)."""

    __slots__ = _READ_PLAN_FIELDS

    def __init__(self, pe_read_tokens: int, de_read_tokens: int) -> None:
        self.pe_read_tokens = pe_read_tokens
        self.de_read_tokens = de_read_tokens

    def __eq__(self, other: object) -> bool:
        return fields_equal(self, other, _READ_PLAN_FIELDS)

    def __hash__(self) -> int:
        return hash(fields_key(self, _READ_PLAN_FIELDS))

    def __repr__(self) -> str:
        return fields_repr(self, _READ_PLAN_FIELDS)

    @property
    def side(self) -> ReadSide:
        """The side reading most of the request (PE on a tie): its label in logs and metrics."""
        return ReadSide.DE if self.de_read_tokens > self.pe_read_tokens else ReadSide.PE
