"""A trace file as a simulator workload: trajectory files as they are, Mooncake request traces as agents.

The simulator replays closed-loop agents (paper A.3); a Mooncake trace (such as the shipped
`mooncake-conversation`, workload/shipped.py) is open-loop requests. `dualpath.workload.mooncake` recovers
its sessions (a request that extends all full blocks of an earlier one continues that conversation); here
each session becomes one agent whose rounds are its requests in arrival order:

- append tokens of round k = input_k − (input_{k−1} + output_{k−1}), at least 0: what the request adds to
  the context the session already holds (round 0: its whole input);
- generated tokens = output_length, at least 1 (the simulator emits at least one token);
- no tool time between rounds: the trace's gaps include the serving system's own latency, so they are not
  a think time the simulator could replay; the agent sends its next request when the previous is done.

The converted file is written once per source content (its name carries a hash of the bytes), so a changed
trace gets a new path and therefore new run-cache keys.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from dualpath.workload.datasets import detect_format
from dualpath.workload.jsonl import write_trajectories
from dualpath.workload.mooncake import read_mooncake
from dualpath.workload.trajectory import Round, Trajectory


def as_trajectory_file(path: Path, folder: Path) -> Path:
    """`path` itself for a trajectory file; for a Mooncake trace, its sessions as a trajectory file."""
    if detect_format(path) == "trajectories":
        return path.resolve()
    digest = hashlib.blake2b(path.read_bytes(), digest_size=6).hexdigest()
    target = (folder / f"{path.stem}-{digest}.trajectories.jsonl").resolve()
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        write_trajectories(tmp, mooncake_agents(path), {"source": path.name, "source_blake2b": digest})
        tmp.replace(target)
    return target


def mooncake_agents(path: Path) -> list[Trajectory]:
    sessions: dict[int, list[Round]] = {}
    context: dict[int, int] = {}
    for r in read_mooncake(path).requests:
        append = r.input_tokens - context.get(r.session_id, 0)
        sessions.setdefault(r.session_id, []).append(Round(append_tokens=max(0, append),
                                                           generated_tokens=max(1, r.output_tokens)))  # fmt: skip
        context[r.session_id] = r.input_tokens + r.output_tokens
    return [Trajectory(trajectory_id=i, rounds=tuple(rounds)) for i, rounds in enumerate(sessions.values())]
