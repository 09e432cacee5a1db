"""Closed-loop agents (paper A.3): each replays its trajectory's rounds back to back (tool time 0).

Round i's prompt is A_1 G_1 ... A_{i-1} G_{i-1} A_i; its hit is the previous round's persisted KV:
whole Full Blocks of the previous prompt + output minus the last output token (which is never fed
back, so it has no KV): hit_i = ⌊(prompt_{i-1} + gen_{i-1} - 1) / block⌋ · block. Hits occur only
within a trajectory and nothing is evicted (A.4).

Trajectories come from `dualpath.workload` (Table 2 generator, A.3 replay); `synthetic_trajectories`
is a minimal stand-in kept for when that package is absent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from dualpath.request import Request, hit_tokens_for

Round = tuple[int, int]  # (append_tokens, gen_tokens)

# Paper Table 2 means: turns, append, gen, total (final length) per dataset.
TABLE2 = {"32k": (60, 608, 148, 28_639), "48k": (106, 474, 172, 42_607), "64k": (157, 429, 176, 55_958)}
# First round of the stand-in: the task prompt (system prompt + issue); not given by the paper.
FIRST_APPEND_TOKENS: Final = 8192


def synthetic_trajectories(name: str, count: int, rng: np.random.Generator) -> list[list[Round]]:
    """Stand-in generator: turns ~ U[0.5, 1.5]·mean, later appends/gens exponential about the means
    that make the final length match Table 2's Total, capped at the dataset's max length."""
    turns_mean, _append, gen_mean, total = TABLE2[name]
    cap = int(name.removesuffix("k")) * 1024
    append_mean = max(1.0, (total - FIRST_APPEND_TOKENS) / turns_mean - gen_mean)
    out: list[list[Round]] = []
    for _ in range(count):
        turns = int(rng.integers(max(1, turns_mean // 2), turns_mean * 3 // 2 + 1))
        rounds: list[Round] = []
        length = 0
        for i in range(turns):
            append = FIRST_APPEND_TOKENS if i == 0 else 1 + int(rng.exponential(append_mean))
            gen = 1 + int(rng.exponential(gen_mean - 1))
            if length + append + gen > cap:
                break
            rounds.append((append, gen))
            length += append + gen
        out.append(rounds or [(FIRST_APPEND_TOKENS, 1)])
    return out


def load_trajectories(dataset: str, count: int, seed: int) -> list[list[Round]]:
    """`count` agents' rounds: the workload package's dataset replayed per A.3 (extra agents get a
    sampled trajectory behind a synthetic first round); the stand-in generator if it is absent."""
    rng = np.random.default_rng(seed)
    try:
        from dualpath.workload import load_round_pairs, replay_round_pairs
    except ImportError:
        if dataset not in TABLE2:
            raise ValueError(f"dataset {dataset!r}: use one of {', '.join(TABLE2)}") from None
        return synthetic_trajectories(dataset, count, rng)
    # `replay_trajectories(load_dataset(dataset, seed=seed), count, rng)` as pairs, without its objects.
    return replay_round_pairs(load_round_pairs(dataset, seed=seed), count, rng)


def scale_rounds(
    trajectories: Sequence[Sequence[Round]], *, append_scale: float = 1.0, gen_scale: float = 1.0
) -> list[list[Round]]:
    """Every round's append and generated tokens times a factor (paper Fig. 9), rounded, at least 1."""
    if append_scale == 1.0 and gen_scale == 1.0:
        return [list(t) for t in trajectories]
    return [
        [(max(1, round(a * append_scale)), max(1, round(g * gen_scale))) for a, g in t] for t in trajectories
    ]


@dataclass
class Agent:
    agent_id: int
    rounds: Sequence[Round]
    start_s: float
    next_round: int = 0
    context_tokens: int = 0  # prompt + output of the rounds so far
    hit_tokens: int = 0
    end_s: float = math.nan

    def next_request(self, request_id: int, now_s: float, block_tokens: int) -> Request | None:
        if self.next_round >= len(self.rounds):
            return None
        append, gen = self.rounds[self.next_round]
        prompt = self.context_tokens + append
        request = Request(
            request_id=request_id,
            trajectory_id=self.agent_id,
            round_index=self.next_round,
            prompt_tokens=prompt,
            hit_tokens=hit_tokens_for(self.hit_tokens, prompt, block_tokens),
            gen_tokens=gen,
            arrival_s=now_s,
        )
        self.next_round += 1
        self.context_tokens = prompt + gen
        self.hit_tokens = (prompt + gen - 1) // block_tokens * block_tokens
        return request
