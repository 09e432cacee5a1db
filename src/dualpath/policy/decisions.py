"""Every decision the core makes, in order, without timestamps, so two drivers' logs compare equal.

A driver may attach its own times elsewhere (metrics); the log holds only *what* was decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath.policy.batching import BatchItem
from dualpath.policy.types import ReadSide


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """A request placed on a (PE, DE) pair with its hit tokens divided between the read paths."""

    request_id: int
    pe_engine: int
    de_engine: int
    pe_read_tokens: int
    de_read_tokens: int

    @property
    def side(self) -> ReadSide:
        return ReadSide.DE if self.de_read_tokens > self.pe_read_tokens else ReadSide.PE


@dataclass(frozen=True, kw_only=True)
class BatchDecision:
    """One PE forward batch: (request, cached, bsz) items; a chunked request has bsz < its remainder."""

    pe_engine: int
    items: tuple[BatchItem, ...]


Decision = Assignment | BatchDecision


@dataclass
class DecisionLog:
    entries: list[Decision] = field(default_factory=list)

    def record(self, decision: Decision) -> None:
        self.entries.append(decision)

    @property
    def assignments(self) -> list[Assignment]:
        return [e for e in self.entries if isinstance(e, Assignment)]

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
