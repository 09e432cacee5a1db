import numpy as np
import pytest

from dualpath.workload.generator import (
    PROFILES,
    TABLE2,
    generate_dataset,
    generate_round_pairs,
    sample_round_arrays,
    table2_means,
)
from dualpath.workload.jsonl import write_trajectories
from dualpath.workload.stats import trajectory_stats

COLUMNS = ("turns", "append_tokens", "generated_tokens", "total_tokens", "context_tokens")


@pytest.mark.parametrize("name", ["32k", "48k", "64k"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_table2_means_within_five_percent(name: str, seed: int) -> None:
    means = table2_means(sample_round_arrays(PROFILES[name], 500, np.random.default_rng(seed)))
    target = TABLE2[name]
    for column in COLUMNS:
        got, want = getattr(means, column), getattr(target, column)
        assert abs(got / want - 1) < 0.05, f"{name} seed {seed} {column}: {got:.1f} vs {want}"


@pytest.mark.parametrize("name", ["32k", "64k"])
def test_generated_trajectories_respect_max_len(name: str) -> None:
    dataset = generate_dataset(name, seed=3)
    assert len(dataset) == 500
    assert max(t.total_tokens for t in dataset) <= PROFILES[name].max_len_tokens
    assert all(t.num_rounds >= 1 for t in dataset)


def test_stats_of_objects_agree_with_vectorised_means() -> None:
    arrays = sample_round_arrays(PROFILES["48k"], 500, np.random.default_rng(7))
    means = table2_means(arrays)
    stats = trajectory_stats(generate_dataset("48k", seed=7))
    assert stats["rounds_per_trajectory"]["mean"] == pytest.approx(means.turns)
    assert stats["append_tokens"]["mean"] == pytest.approx(means.append_tokens)
    assert stats["generated_tokens"]["mean"] == pytest.approx(means.generated_tokens)
    assert stats["total_tokens"]["mean"] == pytest.approx(means.total_tokens)
    assert stats["context_tokens"]["mean"] == pytest.approx(means.context_tokens)


def test_same_seed_same_bytes_different_seed_different(tmp_path) -> None:
    paths = []
    for i, seed in enumerate([11, 11, 12]):
        paths.append(write_trajectories(tmp_path / f"{i}.jsonl", generate_dataset("32k", seed=seed)))
    first, again, other = (p.read_bytes() for p in paths)
    assert first == again
    assert first != other


@pytest.mark.parametrize("name", ["32k", "64k"])
def test_round_pairs_are_the_generated_rounds(name: str) -> None:
    pairs = generate_round_pairs(name, seed=4, num_trajectories=60)
    dataset = generate_dataset(name, seed=4, num_trajectories=60)
    assert pairs == [[(r.append_tokens, r.generated_tokens) for r in t.rounds] for t in dataset]
    assert all(type(x) is int for rounds in pairs for pair in rounds for x in pair)
