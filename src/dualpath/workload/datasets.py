"""One entry point per question: ``load_trace`` (any file, format detected) and ``load_dataset``
(trajectories by dataset name or from a file; ``load_round_pairs``: the same as (append, generated)
tokens per round)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dualpath.workload.errors import TraceFormatError
from dualpath.workload.generator import PROFILES, generate_dataset, generate_round_pairs
from dualpath.workload.jsonl import TrajectoryFile, is_trajectory_header, read_trajectories
from dualpath.workload.mooncake import RequestTrace, is_mooncake_record, read_mooncake
from dualpath.workload.trajectory import Trajectory


@dataclass(frozen=True, kw_only=True)
class LoadedTrace:
    """Exactly one of ``trajectory_file`` (closed-loop agents) or ``request_trace`` (open loop) is set."""

    path: Path
    trajectory_file: TrajectoryFile | None = None
    request_trace: RequestTrace | None = None

    @property
    def kind(self) -> str:
        return "trajectories" if self.trajectory_file is not None else "requests"

    @property
    def skipped_lines(self) -> int:
        source = self.trajectory_file or self.request_trace
        return source.skipped_lines if source is not None else 0


def detect_format(path: str | Path) -> str:
    """``"trajectories"`` or ``"mooncake"``, judged by the first non-empty line."""
    path = Path(path)
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                first = json.loads(line)
            except json.JSONDecodeError as error:
                raise TraceFormatError(f"{path}:{lineno}: not JSON ({error.msg})") from None
            if is_trajectory_header(first):
                return "trajectories"
            if is_mooncake_record(first):
                return "mooncake"
            raise TraceFormatError(
                f"{path}:{lineno}: unknown trace format (expected a dualpath.trajectories header "
                "or a Mooncake record with input_length and hash_ids)"
            )
    raise TraceFormatError(f"{path}:1: empty trace file")


def load_trace(path: str | Path, *, skip_bad: bool = False) -> LoadedTrace:
    path = Path(path)
    if detect_format(path) == "trajectories":
        return LoadedTrace(path=path, trajectory_file=read_trajectories(path, skip_bad=skip_bad))
    return LoadedTrace(path=path, request_trace=read_mooncake(path, skip_bad=skip_bad))


def load_dataset(name_or_path: str | Path, seed: int = 0) -> tuple[Trajectory, ...]:
    """``"32k" | "48k" | "64k"`` → the generated Table 2 dataset (500 trajectories, seeded); otherwise a
    trajectory file. A Mooncake file is open-loop requests, not trajectories: use ``load_trace``."""
    name = _dataset_name(name_or_path)
    if name is not None:
        return generate_dataset(name, seed=seed)
    return _trajectory_file(name_or_path)


def load_round_pairs(name_or_path: str | Path, seed: int = 0) -> list[list[tuple[int, int]]]:
    """``load_dataset``'s trajectories as (append, generated) tokens per round; a named dataset straight
    from the generator's draw, without a ``Round`` per round (what the simulator replays)."""
    name = _dataset_name(name_or_path)
    if name is not None:
        return generate_round_pairs(name, seed=seed)
    return [[(r.append_tokens, r.generated_tokens) for r in t.rounds] for t in _trajectory_file(name_or_path)]


def _dataset_name(name_or_path: str | Path) -> str | None:
    """The generated dataset ``name_or_path`` names (case-insensitive), or None for a file."""
    if isinstance(name_or_path, str) and name_or_path.lower() in PROFILES:
        return name_or_path.lower()
    return None


def _trajectory_file(name_or_path: str | Path) -> tuple[Trajectory, ...]:
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file, and not a dataset name ({', '.join(PROFILES)})")
    loaded = load_trace(path)
    if loaded.trajectory_file is None:
        raise TraceFormatError(f"{path}:1: an open-loop request trace, not trajectories; use load_trace")
    return loaded.trajectory_file.trajectories
