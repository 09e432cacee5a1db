"""A capacity pool with a `can_reserve` / `reserve` pair (STYLE habit 4).

Used for DRAM buffers (bytes, paper A.4: 80 GB/node for DS models) and DE HBM (tokens). A plain
counter, not a block allocator: the scheduler ignores fragmentation (§6.2) and so do we; owners
release exactly what they reserved, keyed by owner so a double release is caught.

NOTE: an owner is any object, told apart by identity: the core passes the request itself. Keyed by
request id, every call boxed the id anew (an int above 256 is a new object each time), which the dict
then hashed and compared with its stored key by value; a request object hashes by its address and is
found by identity, with nothing made per call.
"""

from __future__ import annotations


class CapacityPool:
    def __init__(self, capacity: float, *, name: str) -> None:
        if capacity < 0:
            raise ValueError(f"{name}: capacity must be >= 0")
        self.name = name
        self.capacity = capacity
        self._held: dict[object, float] = {}
        self.used = 0.0

    @property
    def free(self) -> float:
        return self.capacity - self.used

    def can_reserve(self, amount: float) -> bool:
        # A request larger than the whole pool is admitted alone, so it cannot block forever.
        return amount <= self.free or self.used == 0

    def reserve(self, owner: object, amount: float) -> None:
        if not self.can_reserve(amount):
            raise ValueError(f"{self.name}: cannot reserve {amount} (free {self.free})")
        self._held[owner] = self._held.get(owner, 0.0) + amount
        self.used += amount

    def release(self, owner: object) -> float:
        held = self._held
        amount = held[owner]  # `dict.pop` would be a generic method call in the compiled build
        del held[owner]
        self.used -= amount
        if not self._held:
            self.used = 0.0  # drop float dust
        return amount

    def holds(self, owner: object) -> bool:
        return owner in self._held

    def check_invariants(self) -> None:
        assert abs(self.used - sum(self._held.values())) <= 1e-6 * max(1.0, self.capacity), self.name
        assert self.used >= -1e-6, self.name
