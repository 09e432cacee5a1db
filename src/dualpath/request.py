"""The request record the core tracks (one round of one agent trajectory).

Counts that follow from others are `@property`s, never fields updated by hand in two places
(STYLE habit 3). The record is mutable state owned by the core (`dualpath.engine.ClusterCore`);
drivers read it, they never write it.

Token accounting of one request::

    prompt_tokens = hit_tokens + miss_tokens
                    |<- whole Full Blocks read from storage ->|<- computed by the PE ->|
    gen_tokens    = tokens decoded (the first by the PE's last forward, the rest by the DE)
"""

from __future__ import annotations

import enum
from typing import Final, final

from mypy_extensions import mypyc_attr

from dualpath.records import fields_repr


class Phase(enum.Enum):
    """Life of a request, in order (paper §4.1, Fig. 4)."""

    QUEUED = "queued"  # waiting in the scheduler's queues
    ASSIGNED = "assigned"  # PE, DE and read side chosen; its storage read waits in a read_queue
    READING = "reading"  # hit KV moving storage -> SNIC -> DRAM buffer
    READY = "ready"  # hit KV in a DRAM buffer: prefillable
    PREFILLING = "prefilling"  # in a PE forward batch (possibly chunk after chunk)
    TRANSFERRING = "transferring"  # all layers in the DE buffer; one-shot H2D into DE HBM
    DECODING = "decoding"  # in the DE's continuous batch
    DONE = "done"


_FIELDS = (
    "request_id",
    "trajectory_id",
    "round_index",
    "prompt_tokens",
    "hit_tokens",
    "gen_tokens",
    "arrival_s",
    "phase",
    "pe_engine",
    "de_engine",
    "pe_read_tokens",
    "de_read_tokens",
    "computed_tokens",
    "generated_tokens",
    "persisted_tokens",
    "parts_reading",
    "persists_in_flight",
    "dram_holds",
)


# `Request.dram_holds` before the request's KV reached its DE buffer, and once the buffer is released.
NO_DRAM_HOLD: Final = -1
# `RequestsById` drops the slots of gone ids from its front once they are at least this many and half
# its list (a memmove of the rest, so not for every request that leaves).
TRIM_MIN_SLOTS: Final = 1024


def hit_tokens_for(persisted_tokens: int, prompt_tokens: int, block_tokens: int) -> int:
    """The hit a round gets from its prompt's persisted prefix: whole Full Blocks only, leaving at least
    one prompt token to compute (the PE's last forward yields token 1)."""
    return min(persisted_tokens // block_tokens, (prompt_tokens - 1) // block_tokens) * block_tokens


# Plain values only (ids, counts, times, a `Phase`): in no reference cycle, so the native build gives it
# no cyclic-GC header or tracking (docs/simulator-native.md); ≈ 8 M are made at 48P96D.
@mypyc_attr(acyclic=True)
class Request:
    """One round of one agent as the core tracks it; the fields are listed in `_FIELDS`.

    NOTE: a plain class with its own `__init__`, not a dataclass: the native build compiles it to C,
    whereas a dataclass's generated `__init__` stays interpreted (docs/simulator-native.md), and the
    simulator makes one per agent round (≈8 M at 48P96D). Requests compare by identity.
    """

    __slots__ = _FIELDS

    def __init__(
        self,
        *,
        request_id: int,
        trajectory_id: int,
        round_index: int,
        prompt_tokens: int,
        hit_tokens: int,  # cached prefix, whole Full Blocks
        gen_tokens: int,  # output tokens, >= 1
        arrival_s: float,
        phase: Phase = Phase.QUEUED,
        pe_engine: int | None = None,
        de_engine: int | None = None,
        pe_read_tokens: int = 0,
        de_read_tokens: int = 0,
        computed_tokens: int = 0,
        generated_tokens: int = 0,
        persisted_tokens: int = 0,
        parts_reading: int = 0,
    ) -> None:
        if not 0 <= hit_tokens <= prompt_tokens:
            raise ValueError(f"request {request_id}: hit_tokens must lie in [0, prompt_tokens]")
        if hit_tokens == prompt_tokens and prompt_tokens > 0:
            raise ValueError(f"request {request_id}: at least one prompt token must be computed")
        if gen_tokens < 1:
            raise ValueError(f"request {request_id}: gen_tokens must be >= 1")
        self.request_id = request_id
        self.trajectory_id = trajectory_id
        self.round_index = round_index
        self.prompt_tokens = prompt_tokens
        self.hit_tokens = hit_tokens
        self.gen_tokens = gen_tokens
        self.arrival_s = arrival_s
        self.phase = phase
        self.pe_engine = pe_engine
        self.de_engine = de_engine
        self.pe_read_tokens = pe_read_tokens  # hit tokens read by the PE node's SNIC (PE read path)
        self.de_read_tokens = de_read_tokens  # hit tokens read by the DE node's SNIC (DE read path)
        self.computed_tokens = computed_tokens  # miss tokens prefilled so far (chunked prefill advances it)
        self.generated_tokens = generated_tokens  # output tokens produced so far
        self.persisted_tokens = max(persisted_tokens, hit_tokens)  # prefix whose KV is in storage
        self.parts_reading = parts_reading  # storage reads (one per side) not yet finished
        # The core's books on the request, kept on it (not in dicts by request id, looked up per event):
        self.persists_in_flight = 0  # its `StartPersist` commands not yet done
        self.dram_holds = NO_DRAM_HOLD  # H2D / prompt persist still reading its DE buffer landing

    def __repr__(self) -> str:
        return fields_repr(self, _FIELDS)

    @property
    def miss_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def remaining_prefill_tokens(self) -> int:
        return self.miss_tokens - self.computed_tokens

    @property
    def cached_tokens(self) -> int:
        """Tokens whose KV exists before the next prefill chunk: hit + chunks already computed."""
        return self.hit_tokens + self.computed_tokens

    @property
    def total_tokens(self) -> int:
        """`len_r` of §6.2: the DE HBM the request occupies at its end (prompt + output)."""
        return self.prompt_tokens + self.gen_tokens

    @property
    def kv_tokens(self) -> int:
        """Tokens whose KV has been computed: the prompt, then one more per decode step.

        The last output token is never fed back, so a finished request holds prompt + gen - 1.
        """
        return self.prompt_tokens + max(0, self.generated_tokens - 1)

    @property
    def read_tokens(self) -> int:
        return self.pe_read_tokens + self.de_read_tokens

    @property
    def is_prefilled(self) -> bool:
        return self.computed_tokens >= self.miss_tokens


@final
class RequestsById:
    """Live requests by id, for ids given in increasing order (the core's table of its requests).

    NOTE: both drivers number requests 0, 1, 2, ... as they make them (a continuation after a failure
    is a new request with a new id), so a list indexed by id holds them in the order they came, the
    order a dict keeps, without a dict's lookup: an id above 256 is a new int object at every lookup,
    which a dict finds through its index, its entry and the stored key object it compares by value,
    three places in memory where a list has one (on a large cluster's tens of thousands of live
    requests, each is a cache miss: benchmarks/README.md). The slots of the ids below the oldest live
    one leave the front once they are half the list, so the list spans about the live ids only.
    """

    __slots__ = ("_slots", "_base", "_head", "_count")

    def __init__(self) -> None:
        self._slots: list[Request | None] = []
        self._base = 0  # the id of `_slots[0]`
        self._head = 0  # no live request below this slot
        self._count = 0

    def add(self, request: Request) -> None:
        slots = self._slots
        index = request.request_id - self._base
        if index < len(slots):
            raise ValueError(
                f"request id {request.request_id} after {self._base + len(slots) - 1}: ids must increase"
            )
        while len(slots) < index:  # ids skipped (never given): empty slots
            slots.append(None)
        slots.append(request)
        self._count += 1

    def get(self, request_id: int) -> Request | None:
        """The live request with this id; None if there is none."""
        index = request_id - self._base
        if index < self._head or index >= len(self._slots):
            return None
        return self._slots[index]

    def at(self, request_id: int) -> Request:
        """The live request with this id (KeyError if there is none)."""
        request = self.get(request_id)
        if request is None:
            raise KeyError(request_id)
        return request

    def pop(self, request_id: int) -> Request | None:
        """Remove and return the live request with this id; None if there is none."""
        request = self.get(request_id)
        if request is None:
            return None
        index = request_id - self._base
        self._slots[index] = None
        self._count -= 1
        if index == self._head:
            self._trim()
        return request

    def _trim(self) -> None:
        """Past the empty slots at the front; drop them once they are half the list (amortised O(1))."""
        slots = self._slots
        head, n = self._head, len(slots)
        while head < n and slots[head] is None:
            head += 1
        if head >= TRIM_MIN_SLOTS and 2 * head >= n:
            del slots[:head]
            self._base += head
            head = 0
        self._head = head

    def values(self) -> list[Request]:
        """The live requests in id order (the order they were added), as a new list."""
        out: list[Request] = []
        slots = self._slots
        for i in range(self._head, len(slots)):
            request = slots[i]
            if request is not None:
                out.append(request)
        return out

    @property
    def capacity(self) -> int:
        """Slots held: about the span of the live ids (tests)."""
        return len(self._slots)

    def __len__(self) -> int:
        return self._count
