"""Our trajectory file format: JSON Lines, one header line then one trajectory per line.

    {"format": "dualpath.trajectories", "version": 1, ...free metadata...}
    {"trajectory_id": 0, "first_round_synthetic": false, "rounds": [[append, generated, tool_s], ...]}

Writing is deterministic (fixed key order, no whitespace), so the same trajectories give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath.workload.errors import TraceFormatError
from dualpath.workload.trajectory import Round, Trajectory

FORMAT_NAME = "dualpath.trajectories"
FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class TrajectoryFile:
    trajectories: tuple[Trajectory, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0


def write_trajectories(
    path: str | Path, trajectories: Iterable[Trajectory], metadata: Mapping[str, Any] | None = None
) -> Path:
    path = Path(path)
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **(metadata or {})}
    with path.open("w", encoding="utf-8", newline="\n") as out:
        out.write(_dumps(header) + "\n")
        for t in trajectories:
            rounds = [[r.append_tokens, r.generated_tokens, r.tool_time_s] for r in t.rounds]
            record = {
                "trajectory_id": t.trajectory_id,
                "first_round_synthetic": t.first_round_synthetic,
                "rounds": rounds,
            }
            out.write(_dumps(record) + "\n")
    return path


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def is_trajectory_header(first: object) -> bool:
    return isinstance(first, dict) and first.get("format") == FORMAT_NAME


def read_trajectories(path: str | Path, *, skip_bad: bool = False) -> TrajectoryFile:
    """Read a trajectory file; a bad line raises ``TraceFormatError`` naming ``path:line`` unless
    ``skip_bad``, in which case it is skipped and counted (never silently)."""
    path = Path(path)
    trajectories: list[Trajectory] = []
    metadata: dict[str, Any] | None = None
    skipped = 0
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            if metadata is None:
                metadata = _parse_header(path, lineno, line)
                continue
            try:
                trajectories.append(_parse_trajectory(line))
            except (ValueError, TypeError, KeyError) as error:
                if not skip_bad:
                    raise TraceFormatError(f"{path}:{lineno}: {_describe(error)}") from None
                skipped += 1
    if metadata is None:
        raise TraceFormatError(f"{path}:1: empty file, expected a '{FORMAT_NAME}' header line")
    return TrajectoryFile(trajectories=tuple(trajectories), metadata=metadata, skipped_lines=skipped)


def _describe(error: Exception) -> str:
    return f"missing key {error}" if isinstance(error, KeyError) else str(error)


def _parse_header(path: Path, lineno: int, line: str) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceFormatError(f"{path}:{lineno}: not JSON ({error.msg})") from None
    if not is_trajectory_header(header):
        raise TraceFormatError(f'{path}:{lineno}: expected a header with "format": "{FORMAT_NAME}"')
    if header.get("version") != FORMAT_VERSION:
        raise TraceFormatError(
            f"{path}:{lineno}: unsupported version {header.get('version')!r} (this build reads {FORMAT_VERSION})"
        )
    return {k: v for k, v in header.items() if k not in ("format", "version")}


def _parse_trajectory(line: str) -> Trajectory:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg})") from None
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    trajectory_id = record["trajectory_id"]
    if not isinstance(trajectory_id, int) or isinstance(trajectory_id, bool):
        raise ValueError(f"trajectory_id must be an integer, got {trajectory_id!r}")
    raw_rounds = record["rounds"]
    if not isinstance(raw_rounds, list):
        raise ValueError("rounds must be a list of [append, generated, tool_s]")
    rounds = tuple(_parse_round(i, r) for i, r in enumerate(raw_rounds))
    synthetic = record.get("first_round_synthetic", False)
    if not isinstance(synthetic, bool):
        raise ValueError("first_round_synthetic must be true or false")
    return Trajectory(trajectory_id=trajectory_id, rounds=rounds, first_round_synthetic=synthetic)


def _parse_round(index: int, raw: object) -> Round:
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise ValueError(f"round {index}: expected [append, generated] or [append, generated, tool_s]")
    append, generated = raw[0], raw[1]
    tool_s = raw[2] if len(raw) == 3 else 0.0
    for name, value in (("append", append), ("generated", generated)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"round {index}: {name} must be an integer, got {value!r}")
    if not isinstance(tool_s, int | float) or isinstance(tool_s, bool):
        raise ValueError(f"round {index}: tool_s must be a number, got {tool_s!r}")
    try:
        return Round(append_tokens=append, generated_tokens=generated, tool_time_s=float(tool_s))
    except ValueError as error:
        raise ValueError(f"round {index}: {error}") from None
