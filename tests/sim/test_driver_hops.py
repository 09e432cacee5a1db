"""A prefill step's flows: one per path, its bytes summed over the step's items (`driver._add_hop`)."""

from __future__ import annotations

import random

from dualpath.sim.driver import _add_hop
from dualpath.sim.links import Link


def test_hops_sum_per_path_in_first_seen_order_as_a_dict_keyed_by_path_would() -> None:
    rng = random.Random(3)
    links = [Link(f"l{i}", 1e9) for i in range(5)]
    paths = [
        (links[0], links[1]),
        (links[0], links[2]),
        (links[3],),
        (links[1], links[0]),
        (links[4], links[1]),
    ]
    expected: dict[tuple[Link, ...], float] = {}
    ours: list[tuple[Link, ...]] = []
    sizes: list[float] = []
    for _ in range(200):
        path = rng.choice(paths)
        path = tuple(list(path)) if rng.random() < 0.5 else path  # an equal path as another tuple
        size = rng.randrange(1, 10**6) * 1.7
        expected[path] = expected.get(path, 0.0) + size
        _add_hop(ours, sizes, path, size)
    assert ours == list(expected)
    assert sizes == list(expected.values())  # bit for bit: the same additions in the same order
