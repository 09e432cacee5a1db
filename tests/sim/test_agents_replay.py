"""The simulator's agents replay the workload package's trajectories (A.3), as (append, gen) pairs."""

import numpy as np
import pytest

from dualpath.sim.agents import load_trajectories
from dualpath.workload import load_dataset, replay_trajectories
from dualpath.workload.jsonl import write_trajectories


def replayed_pairs(dataset: str, count: int, seed: int) -> list[list[tuple[int, int]]]:
    """What `load_trajectories` must return: the workload's own replay, round by round."""
    agents = replay_trajectories(load_dataset(dataset, seed=seed), count, np.random.default_rng(seed))
    return [[(r.append_tokens, r.generated_tokens) for r in t.rounds] for t in agents]


@pytest.mark.parametrize(("dataset", "count", "seed"), [("64k", 300, 1), ("32K", 1200, 0), ("48k", 500, 3)])
def test_named_datasets_replay_as_the_workload_package_does(dataset: str, count: int, seed: int) -> None:
    assert load_trajectories(dataset, count, seed) == replayed_pairs(dataset, count, seed)


def test_a_trajectory_file_replays_as_the_workload_package_does(tmp_path) -> None:
    path = write_trajectories(tmp_path / "t.jsonl", load_dataset("64k", seed=2)[:7])
    assert load_trajectories(str(path), 25, 2) == replayed_pairs(str(path), 25, 2)


def test_each_agent_gets_its_own_list_of_rounds() -> None:
    agents = load_trajectories("64k", 600, 1)
    assert len({id(rounds) for rounds in agents}) == 600  # `scale_rounds` and agents may not share a list
