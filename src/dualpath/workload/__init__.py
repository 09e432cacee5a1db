"""Agentic workloads: trajectories, the Table 2 generator, replay (A.3) and trace readers/writers."""

from dualpath.workload.datasets import LoadedTrace, load_dataset, load_round_pairs, load_trace
from dualpath.workload.errors import TraceFormatError
from dualpath.workload.generator import PROFILES, TABLE2, generate_dataset, generate_round_pairs
from dualpath.workload.jsonl import read_trajectories, write_trajectories
from dualpath.workload.mooncake import RequestTrace, TraceRequest, read_mooncake
from dualpath.workload.trajectory import (
    Round,
    Trajectory,
    replay_round_pairs,
    replay_sources,
    replay_trajectories,
)

__all__ = [
    "PROFILES",
    "TABLE2",
    "LoadedTrace",
    "RequestTrace",
    "Round",
    "TraceFormatError",
    "TraceRequest",
    "Trajectory",
    "generate_dataset",
    "generate_round_pairs",
    "load_dataset",
    "load_round_pairs",
    "load_trace",
    "read_mooncake",
    "read_trajectories",
    "replay_round_pairs",
    "replay_sources",
    "replay_trajectories",
    "write_trajectories",
]
