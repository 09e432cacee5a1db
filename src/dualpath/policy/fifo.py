"""A first-in, first-out queue of the scheduler's and the core's hot path (the queues of paper §6.1–§6.2).

NOTE: `collections.deque` has no native operations in the compiled build: every `append`, `popleft`
and truth test on one goes through the interpreter's generic method call (a method lookup by name, an
argument tuple, the call), ≈ 2 % of the simulator's instructions across the global, per-group, PE
ready, landing and read queues (docs/simulator-native.md). `Fifo` is a ring of slots in a list, a
native class whose methods compile to direct calls. A slot given up holds None, so the queue keeps no
item alive; the ring doubles when full and never shrinks (a queue's longest length is its size).
The order of items is a deque's, operation for operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final, Generic, TypeVar, cast, final

from mypy_extensions import i64

T = TypeVar("T")

_FIRST_SLOTS: Final = 8


@final
class Fifo(Generic[T]):
    """Items in arrival order: `append` at the tail, `popleft` at the head, `peek` at the head."""

    __slots__ = ("_slots", "_head", "_count")

    def __init__(self) -> None:
        self._slots: list[T | None] = [None] * _FIRST_SLOTS
        self._head: i64 = 0  # slot of the first item
        self._count: i64 = 0  # items held

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __repr__(self) -> str:
        return f"Fifo({self.to_list()!r})"

    def append(self, item: T) -> None:
        slots = self._slots
        size: i64 = len(slots)
        if self._count == size:
            self._grow()
            slots = self._slots
            size = len(slots)
        at = self._head + self._count
        if at >= size:
            at -= size
        slots[at] = item
        self._count += 1

    def popleft(self) -> T:
        if self._count == 0:
            raise IndexError("pop from an empty Fifo")
        slots = self._slots
        head = self._head
        item = slots[head]
        slots[head] = None
        head += 1
        if head == len(slots):
            head = 0
        self._head = head
        self._count -= 1
        return cast(T, item)

    def peek(self) -> T:
        """The first item, left in the queue (`deque[0]`)."""
        if self._count == 0:
            raise IndexError("peek into an empty Fifo")
        return cast(T, self._slots[self._head])

    def at(self, index: i64) -> T:
        """The item `index` places behind the first (`deque[index]`, 0 ≤ index < len)."""
        if index < 0 or index >= self._count:
            raise IndexError(f"Fifo index {index} out of range ({self._count} items)")
        slots = self._slots
        at = self._head + index
        size: i64 = len(slots)
        if at >= size:
            at -= size
        return cast(T, slots[at])

    def to_list(self) -> list[T]:
        """The items, first to last."""
        return [self.at(k) for k in range(self._count)]

    def __iter__(self) -> Iterator[T]:
        """First to last, one at a time (a long queue is not copied); the queue must not change meanwhile."""
        for k in range(self._count):
            yield self.at(k)

    def __contains__(self, item: object) -> bool:
        return any(self.at(k) == item for k in range(self._count))

    def remove(self, item: T) -> None:
        """Drop the first item equal to `item` (`deque.remove`); ValueError if there is none."""
        items = self.to_list()
        items.remove(item)
        self._refill(items, len(self._slots))

    def _grow(self) -> None:
        self._refill(self.to_list(), 2 * len(self._slots))

    def _refill(self, items: list[T], size: int) -> None:
        slots: list[T | None] = [None] * size
        for i in range(len(items)):
            slots[i] = items[i]
        self._slots = slots
        self._head = 0
        self._count = len(items)


def fifo_of(items: Iterable[T]) -> Fifo[T]:
    """A Fifo holding `items`, first to last."""
    queue: Fifo[T] = Fifo()
    for item in items:
        queue.append(item)
    return queue
