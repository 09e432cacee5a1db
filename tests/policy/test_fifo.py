"""`Fifo` against `collections.deque`: the same items in the same order after every operation."""

from __future__ import annotations

import random
from collections import deque

import pytest

from dualpath.policy.fifo import Fifo, fifo_of


def _same(queue: Fifo[int], reference: deque[int]) -> None:
    assert len(queue) == len(reference)
    assert bool(queue) == bool(reference)
    assert queue.to_list() == list(reference)
    assert list(queue) == list(reference)
    for k in range(len(reference)):
        assert queue.at(k) == reference[k]
    if reference:
        assert queue.peek() == reference[0]


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_match_a_deque(seed: int) -> None:
    """Appends in bursts (the ring grows and wraps around), pops, removes from the middle, lookups."""
    rng = random.Random(seed)
    queue: Fifo[int] = Fifo()
    reference: deque[int] = deque()
    next_item = 0
    for _ in range(600):
        action = rng.random()
        if action < 0.45:
            for _ in range(rng.randint(1, 12)):
                queue.append(next_item)
                reference.append(next_item)
                next_item += 1
        elif action < 0.9:
            for _ in range(min(len(reference), rng.randint(1, 12))):
                assert queue.popleft() == reference.popleft()
        elif reference:
            item = rng.choice(list(reference))
            queue.remove(item)
            reference.remove(item)
            assert item not in queue
        probe = rng.randint(0, next_item)
        assert (probe in queue) == (probe in reference)
        _same(queue, reference)


def test_empty_queue_refuses_pop_peek_and_lookups() -> None:
    queue: Fifo[str] = Fifo()
    with pytest.raises(IndexError):
        queue.popleft()
    with pytest.raises(IndexError):
        queue.peek()
    queue.append("a")
    with pytest.raises(IndexError):
        queue.at(1)
    with pytest.raises(IndexError):
        queue.at(-1)
    with pytest.raises(ValueError):
        queue.remove("b")


def test_popped_slots_keep_nothing_alive() -> None:
    """A popped item is no longer referenced by the queue (a request is freed once it leaves)."""
    import weakref

    class Item:
        pass

    item = Item()
    ref = weakref.ref(item)
    queue: Fifo[Item] = fifo_of([item])
    del item
    queue.popleft()
    assert ref() is None
