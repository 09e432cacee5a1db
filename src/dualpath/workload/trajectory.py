"""Agentic trajectories: rounds of (append, generated, tool time), and their replay (paper Appendix A.3).

A trajectory is a multi-turn agent episode. Round i's prompt re-sends the whole history plus a short
append, and the model is forced to produce exactly ``generated_tokens`` (A.3 stores the count, not the
tokens)::

    round 0 prompt:  A0                          -> G0
    round 1 prompt:  A0 G0 A1                    -> G1     hit = |A0 G0|
    round 2 prompt:  A0 G0 A1 G1 A2              -> G2     hit = |A0 G0 A1 G1|

so ``context_tokens(i) = sum(A[:i]) + sum(G[:i]) + A[i]`` and ``hit_tokens(i) = context_tokens(i) - A[i]``
(all of round i-1's prompt and its generated tokens; round 0 has no hit). Hits occur only within a
trajectory (A.4), so the hit length is pure arithmetic on the trajectory, no cache model needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True)
class Round:
    """One agent turn: tokens appended to the prompt, tokens the model must generate, tool latency after."""

    append_tokens: int
    generated_tokens: int
    tool_time_s: float = 0.0

    def __post_init__(self) -> None:
        if self.append_tokens < 0:
            raise ValueError(f"append_tokens must be >= 0, got {self.append_tokens}")
        if self.generated_tokens < 1:
            raise ValueError(
                f"generated_tokens must be >= 1 (a request yields a token), got {self.generated_tokens}"
            )
        if not self.tool_time_s >= 0.0:
            raise ValueError(f"tool_time_s must be >= 0, got {self.tool_time_s}")


def _frozen(values: npt.ArrayLike) -> IntArray:
    array = np.asarray(values, dtype=np.int64)
    array.flags.writeable = False
    return array


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """An ordered tuple of rounds. Derived per-round arrays are computed once, lazily, as read-only numpy.

    ``first_round_synthetic`` marks a replayed copy whose round 0 is a random-token prefix (A.3), so
    its KV never matches the original trajectory's.
    """

    trajectory_id: int
    rounds: tuple[Round, ...]
    first_round_synthetic: bool = False

    def __post_init__(self) -> None:
        if not self.rounds:
            raise ValueError(f"trajectory {self.trajectory_id} has no rounds")
        if self.rounds[0].append_tokens < 1:
            raise ValueError(f"trajectory {self.trajectory_id}: the first prompt must have >= 1 token")

    @classmethod
    def from_arrays(
        cls,
        *,
        trajectory_id: int,
        append_tokens: npt.ArrayLike,
        generated_tokens: npt.ArrayLike,
        tool_time_s: npt.ArrayLike | None = None,
        first_round_synthetic: bool = False,
    ) -> Trajectory:
        appends = np.asarray(append_tokens, dtype=np.int64).tolist()
        gens = np.asarray(generated_tokens, dtype=np.int64).tolist()
        if len(appends) != len(gens):
            raise ValueError("append_tokens and generated_tokens differ in length")
        tools = [0.0] * len(appends) if tool_time_s is None else np.asarray(tool_time_s, dtype=float).tolist()
        rounds = tuple(
            Round(append_tokens=a, generated_tokens=g, tool_time_s=t)
            for a, g, t in zip(appends, gens, tools, strict=True)
        )
        return cls(trajectory_id=trajectory_id, rounds=rounds, first_round_synthetic=first_round_synthetic)

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @cached_property
    def append_tokens_array(self) -> IntArray:
        return _frozen([r.append_tokens for r in self.rounds])

    @cached_property
    def generated_tokens_array(self) -> IntArray:
        return _frozen([r.generated_tokens for r in self.rounds])

    @cached_property
    def hit_tokens_array(self) -> IntArray:
        """Tokens of each round's prompt already computed in the previous round (A0 G0 … A(i-1) G(i-1))."""
        per_round = self.append_tokens_array + self.generated_tokens_array
        return _frozen(np.concatenate(([0], np.cumsum(per_round)[:-1])))

    @cached_property
    def context_tokens_array(self) -> IntArray:
        """Each round's prompt length (A.3): the history so far plus this round's append."""
        return _frozen(self.hit_tokens_array + self.append_tokens_array)

    @property
    def total_tokens(self) -> int:
        """Final length: every append and every generated token."""
        return int(self.context_tokens_array[-1] + self.generated_tokens_array[-1])

    def context_tokens(self, round_index: int) -> int:
        return int(self.context_tokens_array[round_index])

    def hit_tokens(self, round_index: int, block_tokens: int | None = None) -> int:
        """Cached prefix of round ``round_index``'s prompt; with ``block_tokens``, whole blocks only
        (only full blocks are persisted to storage, paper §4.1)."""
        hit = int(self.hit_tokens_array[round_index])
        return hit if block_tokens is None else hit - hit % block_tokens

    def miss_tokens(self, round_index: int, block_tokens: int | None = None) -> int:
        return self.context_tokens(round_index) - self.hit_tokens(round_index, block_tokens)

    def block_hit_tokens_array(self, block_tokens: int) -> IntArray:
        hits = self.hit_tokens_array
        return _frozen(hits - hits % block_tokens)


def replay_trajectories(
    dataset: tuple[Trajectory, ...] | list[Trajectory],
    num_agents: int,
    rng: np.random.Generator,
    *,
    synthetic_append_tokens: int | None = None,
) -> tuple[Trajectory, ...]:
    """Give ``num_agents`` agents one trajectory each (paper Appendix A.3).

    Agents ``0 … len(dataset)-1`` replay the dataset in order. Beyond that (A.3: "to run more than 500
    agents, sample a trajectory and prepend a synthetic round: random-token A_1 with g_1 = 1"), each extra
    agent samples a trajectory uniformly with replacement and gets a new round 0 of random tokens with
    exactly one generated token. Our reading of "random-token A_1": the synthetic append has the same
    length as the sampled trajectory's own first prompt (a fresh random-token copy of A_1), unless
    ``synthetic_append_tokens`` says otherwise. Its only job is to give the copy a prefix no other agent
    shares, so no cross-trajectory cache hit appears (A.4). Agent i's trajectory gets ``trajectory_id=i``.
    """
    sources = replay_sources(len(dataset), num_agents, rng)
    return tuple(
        _renumber(dataset[k], agent)
        if agent < len(dataset)
        else _with_synthetic_round(dataset[k], agent, synthetic_append_tokens)
        for agent, k in enumerate(sources)
    )


def replay_round_pairs(
    dataset: list[list[tuple[int, int]]], num_agents: int, rng: np.random.Generator
) -> list[list[tuple[int, int]]]:
    """``replay_trajectories`` on (append, generated) pairs per round (``load_round_pairs``): the same
    draws and the same synthetic round 0 (the source's first append, one generated token). Every agent
    gets its own list; the pairs themselves are shared."""
    out: list[list[tuple[int, int]]] = []
    for agent, k in enumerate(replay_sources(len(dataset), num_agents, rng)):
        rounds = dataset[k]
        out.append(list(rounds) if agent < len(dataset) else [(rounds[0][0], 1), *rounds])
    return out


def replay_sources(dataset_size: int, num_agents: int, rng: np.random.Generator) -> list[int]:
    """The dataset trajectory each agent replays (`replay_trajectories`' A.3 rule): agent i < dataset_size
    its own, each later one a uniform draw with replacement (and, there, a synthetic round 0)."""
    if num_agents < 0:
        raise ValueError(f"num_agents must be >= 0, got {num_agents}")
    if not dataset_size:
        raise ValueError("cannot replay an empty dataset")
    extra = num_agents - min(num_agents, dataset_size)
    picks = rng.integers(0, dataset_size, size=extra).tolist() if extra > 0 else []
    return list(range(num_agents - extra)) + picks


def _renumber(trajectory: Trajectory, trajectory_id: int) -> Trajectory:
    if trajectory.trajectory_id == trajectory_id:
        return trajectory
    return Trajectory(
        trajectory_id=trajectory_id,
        rounds=trajectory.rounds,
        first_round_synthetic=trajectory.first_round_synthetic,
    )


def _with_synthetic_round(source: Trajectory, trajectory_id: int, append_tokens: int | None) -> Trajectory:
    length = source.rounds[0].append_tokens if append_tokens is None else append_tokens
    synthetic = Round(append_tokens=length, generated_tokens=1)
    return Trajectory(
        trajectory_id=trajectory_id, rounds=(synthetic, *source.rounds), first_round_synthetic=True
    )
