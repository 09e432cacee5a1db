"""Synthetic agentic datasets matched to the paper's Table 2 (32K / 48K / 64K, 500 trajectories each).

NOTE: how a trajectory is drawn (all log-normal parameters are in natural-log space)::

    first prompt   A0 ~ LogNormal(first_prompt_median, first_prompt_sigma)      system prompt + repo context
    agent scale    s  ~ LogNormal(1, append_scale_sigma), |z| <= append_scale_clip  how verbose its tools are
    later appends  Ai ~ s * LogNormal(append_median, append_sigma)              tool outputs, heavy-tailed
    generated      Gi ~ Gamma(generated_gamma_shape, mean generated_mean)       tool calls / thoughts
    budget         B  ~ LogNormal(budget_median, budget_sigma), >= min_budget   rounds until the bug is fixed
    stop at round B, or before the first round whose prompt no longer fits in MaxLen; the last round's
    generation is cut so that the final length never exceeds MaxLen (an RL rollout's length cap).

The per-trajectory latents (A0, s, B) are drawn by stratified sampling (one draw per 1/N quantile slice,
then shuffled) so that 500 trajectories reproduce the population means closely; the per-round draws are
plain i.i.d. The parameters in ``PROFILES`` were fitted to Table 2 by ``dualpath.workload.calibrate``
(Newton's method on the five free parameters, common random numbers); see docs/workload.md for the
reading of each column and the procedure.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from dualpath.workload.trajectory import Trajectory

TRAJECTORIES_PER_DATASET = 500  # paper §7.2, Table 2: "500 trajectories each"


@dataclass(frozen=True, kw_only=True)
class Table2Row:
    """One row of paper Table 2 (all means). Reading: see ``table2_means``."""

    max_len_tokens: int
    turns: float
    append_tokens: float
    generated_tokens: float
    total_tokens: float
    context_tokens: float


# Paper Table 2. "32K" is read as 32 × 1024 tokens.
TABLE2: dict[str, Table2Row] = {
    "32k": Table2Row(
        max_len_tokens=32 * 1024,
        turns=60,
        append_tokens=608,
        generated_tokens=148,
        total_tokens=28_639,
        context_tokens=17_183,
    ),
    "48k": Table2Row(
        max_len_tokens=48 * 1024,
        turns=106,
        append_tokens=474,
        generated_tokens=172,
        total_tokens=42_607,
        context_tokens=25_120,
    ),
    "64k": Table2Row(
        max_len_tokens=64 * 1024,
        turns=157,
        append_tokens=429,
        generated_tokens=176,
        total_tokens=55_958,
        context_tokens=32_721,
    ),
}


@dataclass(frozen=True, kw_only=True)
class DatasetProfile:
    """Distribution parameters of one synthetic dataset (see the module NOTE for their roles)."""

    name: str
    max_len_tokens: int
    first_prompt_median_tokens: float
    append_median_tokens: float
    append_scale_sigma: float
    budget_median_rounds: float
    generated_mean_tokens: float
    # Shape parameters held fixed during the fit (chosen, not fitted; see docs/workload.md).
    first_prompt_sigma: float = 0.4
    append_sigma: float = 0.5
    append_scale_clip: float = 2.0
    generated_gamma_shape: float = 1.5
    budget_sigma: float = 0.8
    min_budget_rounds: int = 4
    max_budget_rounds: int = 4096

    def __post_init__(self) -> None:
        if self.max_len_tokens < 4:
            raise ValueError(f"max_len_tokens too small: {self.max_len_tokens}")
        positive = (self.first_prompt_median_tokens, self.append_median_tokens, self.generated_mean_tokens)
        if min(positive) <= 0 or self.budget_median_rounds <= 0:
            raise ValueError(f"profile {self.name}: medians and means must be > 0")


# Fitted by `python -m dualpath.workload.calibrate` to TABLE2 (the dataset's published statistics).
PROFILES: dict[str, DatasetProfile] = {
    "32k": DatasetProfile(
        name="32k",
        max_len_tokens=32 * 1024,
        first_prompt_median_tokens=4674.2,
        append_median_tokens=220.22,
        append_scale_sigma=1.2615,
        budget_median_rounds=102.94,
        generated_mean_tokens=148.12,
    ),
    "48k": DatasetProfile(
        name="48k",
        max_len_tokens=48 * 1024,
        first_prompt_median_tokens=5701.3,
        append_median_tokens=127.87,
        append_scale_sigma=1.5407,
        budget_median_rounds=173.66,
        generated_mean_tokens=172.25,
    ),
    "64k": DatasetProfile(
        name="64k",
        max_len_tokens=64 * 1024,
        first_prompt_median_tokens=6532.7,
        append_median_tokens=83.24,
        append_scale_sigma=1.8198,
        budget_median_rounds=245.53,
        generated_mean_tokens=176.26,
    ),
}


@dataclass(frozen=True, kw_only=True)
class RoundArrays:
    """Padded per-round arrays ``[trajectories, rounds]`` (zeros past ``num_rounds``)."""

    append_tokens: npt.NDArray[np.int64]
    generated_tokens: npt.NDArray[np.int64]
    num_rounds: npt.NDArray[np.int64]


def profile_for(name: str) -> DatasetProfile:
    key = name.lower()
    if key not in PROFILES:
        raise KeyError(f"unknown dataset {name!r}; choose one of {', '.join(PROFILES)}")
    return PROFILES[key]


def generate_dataset(
    dataset: str | DatasetProfile,
    *,
    seed: int = 0,
    num_trajectories: int = TRAJECTORIES_PER_DATASET,
) -> tuple[Trajectory, ...]:
    """Draw ``num_trajectories`` trajectories; the same (dataset, seed, count) gives the same result."""
    arrays = _dataset_arrays(dataset, seed, num_trajectories)
    return tuple(
        Trajectory.from_arrays(
            trajectory_id=j,
            append_tokens=arrays.append_tokens[j, :n],
            generated_tokens=arrays.generated_tokens[j, :n],
        )
        for j, n in enumerate(arrays.num_rounds.tolist())
    )


def generate_round_pairs(
    dataset: str | DatasetProfile,
    *,
    seed: int = 0,
    num_trajectories: int = TRAJECTORIES_PER_DATASET,
) -> list[list[tuple[int, int]]]:
    """`generate_dataset`'s trajectories as (append, generated) tokens per round, from the same draw,
    without a `Round` per round: what the simulator replays (≈ 80 K rounds per dataset)."""
    arrays = _dataset_arrays(dataset, seed, num_trajectories)
    appends, gens = arrays.append_tokens, arrays.generated_tokens
    # Each row's kept rounds only: the matrices are as wide as the longest budget (64K: 2,707 columns
    # against 158 kept rounds per row on average).
    return [
        list(zip(appends[j, :n].tolist(), gens[j, :n].tolist(), strict=True))
        for j, n in enumerate(arrays.num_rounds.tolist())
    ]


def _dataset_arrays(dataset: str | DatasetProfile, seed: int, num_trajectories: int) -> RoundArrays:
    profile = profile_for(dataset) if isinstance(dataset, str) else dataset
    return sample_round_arrays(profile, num_trajectories, np.random.default_rng(seed))


def sample_round_arrays(
    profile: DatasetProfile, num_trajectories: int, rng: np.random.Generator
) -> RoundArrays:
    """The vectorised core of the generator (also used by the calibration)."""
    n = num_trajectories
    z_first = _stratified_normal(rng, n)
    z_scale = np.clip(_stratified_normal(rng, n), -profile.append_scale_clip, profile.append_scale_clip)
    z_budget = _stratified_normal(rng, n)
    first = np.exp(np.log(profile.first_prompt_median_tokens) + profile.first_prompt_sigma * z_first)
    first = np.clip(np.rint(first), 1, profile.max_len_tokens // 2)
    scale = np.exp(profile.append_scale_sigma * z_scale)
    budget = np.exp(np.log(profile.budget_median_rounds) + profile.budget_sigma * z_budget)
    budget = np.clip(np.rint(budget), profile.min_budget_rounds, profile.max_budget_rounds).astype(np.int64)
    columns = int(budget.max()) if n else 0

    noise = rng.standard_normal((n, columns))
    appends = np.rint(profile.append_median_tokens * scale[:, None] * np.exp(profile.append_sigma * noise))
    appends = np.maximum(appends, 1).astype(np.int64)
    if columns:
        appends[:, 0] = first.astype(np.int64)
    shape = profile.generated_gamma_shape
    gamma = rng.gamma(shape, profile.generated_mean_tokens / shape, size=(n, columns))
    gens = np.maximum(np.rint(gamma), 1).astype(np.int64)
    return _truncate(appends, gens, budget, profile.max_len_tokens)


def _truncate(
    appends: npt.NDArray[np.int64],
    gens: npt.NDArray[np.int64],
    budget: npt.NDArray[np.int64],
    max_len_tokens: int,
) -> RoundArrays:
    """Keep round i while i < budget and its prompt leaves room for one token; cut the last generation."""
    prompt = np.cumsum(appends + gens, axis=1) - gens
    index = np.arange(appends.shape[1])[None, :]
    keep = (index < budget[:, None]) & (prompt + 1 <= max_len_tokens)
    keep = np.logical_and.accumulate(keep, axis=1)
    gens = np.where(keep, np.minimum(gens, max_len_tokens - prompt), 0)
    appends = np.where(keep, appends, 0)
    return RoundArrays(append_tokens=appends, generated_tokens=gens, num_rounds=keep.sum(axis=1))


def table2_means(arrays: RoundArrays) -> Table2Row:
    """Table 2's columns for a set of trajectories, under our reading (docs/workload.md):

    turns, total: mean over trajectories; append, generated: mean over trajectories of each trajectory's
    mean per round (round 0's prompt counts as its append); context: mean over all rounds of all
    trajectories of the prompt length.
    """
    rounds = arrays.num_rounds.astype(float)
    appends = arrays.append_tokens.sum(axis=1)
    gens = arrays.generated_tokens.sum(axis=1)
    prompt = np.cumsum(arrays.append_tokens + arrays.generated_tokens, axis=1) - arrays.generated_tokens
    valid = np.arange(arrays.append_tokens.shape[1])[None, :] < arrays.num_rounds[:, None]
    return Table2Row(
        max_len_tokens=0,
        turns=float(rounds.mean()),
        append_tokens=float((appends / rounds).mean()),
        generated_tokens=float((gens / rounds).mean()),
        total_tokens=float((appends + gens).mean()),
        context_tokens=float(prompt[valid].mean()),
    )


def _stratified_normal(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    """One standard-normal draw per 1/n probability slice, in random order (Latin hypercube sampling)."""
    uniform = (rng.permutation(n) + rng.random(n)) / n
    inverse = NormalDist().inv_cdf
    return np.array([inverse(u) for u in uniform.tolist()], dtype=float)
