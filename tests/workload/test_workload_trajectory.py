import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath.workload.trajectory import (
    Round,
    Trajectory,
    replay_round_pairs,
    replay_sources,
    replay_trajectories,
)


def make_trajectory(appends: list[int], gens: list[int], trajectory_id: int = 0) -> Trajectory:
    return Trajectory.from_arrays(trajectory_id=trajectory_id, append_tokens=appends, generated_tokens=gens)


rounds_strategy = st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 2000)), min_size=1, max_size=40)


@given(rounds_strategy)
def test_context_grows_by_previous_generation_and_next_append(rounds: list[tuple[int, int]]) -> None:
    t = make_trajectory([a for a, _ in rounds], [g for _, g in rounds])
    assert t.context_tokens(0) == rounds[0][0]
    for i in range(len(rounds) - 1):
        assert t.context_tokens(i + 1) == t.context_tokens(i) + rounds[i][1] + rounds[i + 1][0]
    assert t.total_tokens == sum(a + g for a, g in rounds)


@given(rounds_strategy, st.sampled_from([16, 64, 512]))
def test_hit_is_previous_prompt_plus_its_generation(rounds: list[tuple[int, int]], block: int) -> None:
    t = make_trajectory([a for a, _ in rounds], [g for _, g in rounds])
    assert t.hit_tokens(0) == 0
    for i in range(1, len(rounds)):
        assert t.hit_tokens(i) == t.context_tokens(i - 1) + rounds[i - 1][1]
        assert t.hit_tokens(i) + t.miss_tokens(i) == t.context_tokens(i)
        blocked = t.hit_tokens(i, block_tokens=block)
        assert blocked % block == 0 and 0 <= t.hit_tokens(i) - blocked < block
    assert list(t.block_hit_tokens_array(block)) == [t.hit_tokens(i, block) for i in range(len(rounds))]


def test_arrays_are_read_only() -> None:
    t = make_trajectory([100, 10], [5, 5])
    with pytest.raises(ValueError):
        t.context_tokens_array[0] = 1


def test_round_rejects_zero_generation_and_empty_first_prompt() -> None:
    with pytest.raises(ValueError, match="generated_tokens"):
        Round(append_tokens=10, generated_tokens=0)
    with pytest.raises(ValueError, match="first prompt"):
        make_trajectory([0, 5], [1, 1])


def test_replay_keeps_dataset_order_when_agents_fit() -> None:
    dataset = tuple(make_trajectory([100 + i], [1], trajectory_id=i) for i in range(5))
    replayed = replay_trajectories(dataset, 3, np.random.default_rng(0))
    assert [t.rounds for t in replayed] == [t.rounds for t in dataset[:3]]
    assert not any(t.first_round_synthetic for t in replayed)


def test_replay_beyond_dataset_prepends_synthetic_round_with_one_token() -> None:
    dataset = tuple(make_trajectory([100 * (i + 1), 7], [3, 4], trajectory_id=i) for i in range(4))
    replayed = replay_trajectories(dataset, 10, np.random.default_rng(1))
    assert [t.trajectory_id for t in replayed] == list(range(10))
    for extra in replayed[4:]:
        assert extra.first_round_synthetic
        synthetic, *original = extra.rounds
        assert synthetic.generated_tokens == 1
        source = next(d for d in dataset if d.rounds == tuple(original))
        assert synthetic.append_tokens == source.rounds[0].append_tokens
        # the copy's original rounds now hit on the synthetic prefix, never on the source's cache
        assert extra.hit_tokens(1) == synthetic.append_tokens + 1


def test_replay_is_deterministic_per_seed() -> None:
    dataset = tuple(make_trajectory([100 * (i + 1)], [3], trajectory_id=i) for i in range(20))
    first = replay_trajectories(dataset, 200, np.random.default_rng(5))
    again = replay_trajectories(dataset, 200, np.random.default_rng(5))
    other = replay_trajectories(dataset, 200, np.random.default_rng(6))
    assert first == again
    assert first != other


def test_replay_sources_are_the_dataset_in_order_then_uniform_draws() -> None:
    assert replay_sources(5, 3, np.random.default_rng(0)) == [0, 1, 2]
    sources = replay_sources(4, 10, np.random.default_rng(1))
    assert sources[:4] == [0, 1, 2, 3]
    assert sources[4:] == np.random.default_rng(1).integers(0, 4, size=6).tolist()
    with pytest.raises(ValueError, match="empty"):
        replay_sources(0, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="num_agents"):
        replay_sources(3, -1, np.random.default_rng(0))


def test_replay_of_round_pairs_is_the_replay_of_trajectories() -> None:
    dataset = tuple(make_trajectory([100 * (i + 1), 7], [3, 4 + i], trajectory_id=i) for i in range(4))
    pairs = [[(r.append_tokens, r.generated_tokens) for r in t.rounds] for t in dataset]
    replayed = replay_trajectories(dataset, 10, np.random.default_rng(1))
    got = replay_round_pairs(pairs, 10, np.random.default_rng(1))
    assert got == [[(r.append_tokens, r.generated_tokens) for r in t.rounds] for t in replayed]
    assert len({id(rounds) for rounds in got}) == 10  # each agent its own list
