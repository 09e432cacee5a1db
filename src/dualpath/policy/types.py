"""Small value types the policies exchange (frozen; no behaviour beyond derived values)."""

from __future__ import annotations

import enum
from typing import NamedTuple

from dualpath.records import fields_repr

# EngineLoad's fields, once: its slots and its repr.
_ENGINE_LOAD_FIELDS = (
    "engine_id",
    "node_id",
    "seq",
    "tok",
    "compute_tok",
    "read_q_tokens",
    "free_hbm_tokens",
)


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


class NodeReadState(NamedTuple):
    """A node's storage read queue as a read-path policy sees it (§6.3)."""

    read_q_tokens: int
    read_tokens_per_s: float  # how fast this node's storage path drains its queue


class ReadPlan(NamedTuple):
    """How a request's hit tokens are divided between the two read paths."""

    pe_read_tokens: int
    de_read_tokens: int

    @property
    def side(self) -> ReadSide:
        """The side reading most of the request (PE on a tie): its label in logs and metrics."""
        return ReadSide.DE if self.de_read_tokens > self.pe_read_tokens else ReadSide.PE
