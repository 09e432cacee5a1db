"""Every decision the core makes, in order, without timestamps, so two drivers' logs compare equal.

A driver may attach its own times elsewhere (metrics); the log holds only *what* was decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath.policy.batching import BatchItem
from dualpath.policy.types import ReadSide
from dualpath.records import fields_equal, fields_key, fields_repr

_ASSIGNMENT_FIELDS = ("request_id", "pe_engine", "de_engine", "pe_read_tokens", "de_read_tokens")
_BATCH_DECISION_FIELDS = ("pe_engine", "items")


class Assignment:
    """A request placed on a (PE, DE) pair with its hit tokens divided between the read paths.

    NOTE: a plain slotted class compared by value, not a frozen dataclass: in the native build a
    dataclass's generated `__init__` stays interpreted (a frozen one sets each field through
    `object.__setattr__`), and every placement makes one. Treat it as immutable.
    """

    __slots__ = _ASSIGNMENT_FIELDS

    def __init__(
        self, *, request_id: int, pe_engine: int, de_engine: int, pe_read_tokens: int, de_read_tokens: int
    ) -> None:
        self.request_id = request_id
        self.pe_engine = pe_engine
        self.de_engine = de_engine
        self.pe_read_tokens = pe_read_tokens
        self.de_read_tokens = de_read_tokens

    def __eq__(self, other: object) -> bool:
        return fields_equal(self, other, _ASSIGNMENT_FIELDS)

    def __hash__(self) -> int:
        return hash(fields_key(self, _ASSIGNMENT_FIELDS))

    def __repr__(self) -> str:
        return fields_repr(self, _ASSIGNMENT_FIELDS)

    @property
    def side(self) -> ReadSide:
        return ReadSide.DE if self.de_read_tokens > self.pe_read_tokens else ReadSide.PE


class BatchDecision:
    """One PE forward batch: (request, cached, bsz) items; a chunked request has bsz < its remainder.

    A plain slotted class compared by value, for the reason `Assignment` gives (one per engine per step).
    """

    __slots__ = _BATCH_DECISION_FIELDS

    def __init__(self, *, pe_engine: int, items: tuple[BatchItem, ...]) -> None:
        self.pe_engine = pe_engine
        self.items = items

    def __eq__(self, other: object) -> bool:
        return fields_equal(self, other, _BATCH_DECISION_FIELDS)

    def __hash__(self) -> int:
        return hash(fields_key(self, _BATCH_DECISION_FIELDS))

    def __repr__(self) -> str:
        return fields_repr(self, _BATCH_DECISION_FIELDS)


Decision = Assignment | BatchDecision


@dataclass
class DecisionLog:
    """The decisions in order (`entries`), and the hit tokens every assignment put on each read path.

    A driver reads what was logged since its last look with `take_unread`; one that need not keep the
    decisions (a long simulation: 7.8 M assignments and as many batch items at 48P96D; a server that
    records nothing) drops them there, and the read-token sums stay whole.
    """

    entries: list[Decision] = field(default_factory=list)
    pe_read_tokens: int = 0  # Σ over every assignment recorded, kept or not
    de_read_tokens: int = 0
    unread_from: int = 0  # entries before this index were handed out by `take_unread`

    def record(self, decision: Decision) -> None:
        if isinstance(decision, Assignment):
            self.pe_read_tokens += decision.pe_read_tokens
            self.de_read_tokens += decision.de_read_tokens
        self.entries.append(decision)

    def take_unread(self, *, keep: bool) -> list[Decision]:
        """The decisions logged since the last call, in order. `keep=False` drops them (and any kept before)
        from `entries`."""
        unread = self.entries[self.unread_from :]
        if keep:
            self.unread_from = len(self.entries)
        else:
            self.entries.clear()
            self.unread_from = 0
        return unread

    @property
    def assignments(self) -> list[Assignment]:
        return [e for e in self.entries if isinstance(e, Assignment)]

    def read_tokens(self) -> tuple[int, int]:
        """(PE-read, DE-read) hit tokens over every assignment recorded: the summary's DE read fraction."""
        return self.pe_read_tokens, self.de_read_tokens

    @property
    def batches(self) -> list[BatchDecision]:
        return [e for e in self.entries if isinstance(e, BatchDecision)]

    def per_engine(self) -> dict[str, list[Decision]]:
        """Decisions grouped by stream, for comparing two drivers whose event interleavings differ.

        Keys: "assign" (the scheduler's single stream) and "pe<id>" (each PE's batch sequence).
        """
        out: dict[str, list[Decision]] = {"assign": list[Decision](self.assignments)}
        for b in self.batches:
            out.setdefault(f"pe{b.pe_engine}", []).append(b)
        return out
