"""Per-piece timings of one runtime process, for `benchmarks/runtime_profile.py`: where a request's time goes.

Off unless the environment names a folder (`DUALPATH_PROFILE_DIR`, inherited by the node processes `serve`
spawns): then every call below is a no-op that returns at once. On, a process records

    span   a piece of work on one thread (a forward, a decode run, a driver event): start, wall and the
           thread's CPU time, with the keys it belongs to (rid, step, ...)
    mark   an instant: a message sent or received, keyed the same way at both ends

and writes them to `<folder>/<process>.jsonl` when it stops. The processes of one host share
CLOCK_MONOTONIC (`time.monotonic`), so a message's send mark in one process and its receipt mark in another
give the trip between them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PROFILE_DIR_ENV = "DUALPATH_PROFILE_DIR"
_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


class Spans:
    """One process's spans and marks; `list.append` is atomic, so any thread records without a lock."""

    def __init__(self, process: str, folder: Path | None = None) -> None:
        self.process = process
        self.folder = folder
        self.records: list[dict[str, Any]] = []

    @classmethod
    def from_env(cls, process: str) -> Spans:
        folder = os.environ.get(PROFILE_DIR_ENV)
        return cls(process, Path(folder) if folder else None)

    @property
    def on(self) -> bool:
        return self.folder is not None

    def span(self, piece: str, **keys: Any) -> contextlib.AbstractContextManager[None]:
        """Time the block as `piece` (wall and this thread's CPU)."""
        return _OFF if self.folder is None else self._timed(piece, keys)

    def mark(self, piece: str, **keys: Any) -> None:
        if self.folder is not None:
            self.records.append({"piece": piece, "t": time.monotonic(), **keys})

    @contextlib.contextmanager
    def _timed(self, piece: str, keys: dict[str, Any]) -> Iterator[None]:
        wall0, cpu0 = time.monotonic(), time.thread_time()
        try:
            yield
        finally:
            cpu, end = time.thread_time() - cpu0, time.monotonic()
            thread = threading.current_thread().name
            self.records.append(
                {"piece": piece, "t": wall0, "wall": end - wall0, "cpu": cpu, "thread": thread, **keys}
            )

    def dump(self) -> Path | None:
        """Write the records (one JSON object a line); None when off."""
        if self.folder is None:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.process}.jsonl"
        totals = {
            "piece": "process",
            "t": time.monotonic(),
            "cpu": time.process_time(),
            "threads": thread_cpu_s(),
        }
        with path.open("w") as out:
            for record in [*self.records, totals]:
                out.write(json.dumps({"process": self.process, **record}) + "\n")
        return path


def message_keys(message: dict[str, Any]) -> dict[str, Any]:
    """What ties a control message to its other end: its type and the request or step it is about."""
    keys = {k: message[k] for k in ("rid", "step", "step_id", "from_hbm") if k in message}
    return {"msg": message.get("type"), **keys}


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds of each live thread of this process by its Python name (Linux /proc; {} elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        with contextlib.suppress(OSError, IndexError, TypeError):
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            out[thread.name] = out.get(thread.name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def read_spans(folder: Path) -> list[dict[str, Any]]:
    """Every record the processes wrote under `folder`."""
    records = []
    for path in sorted(folder.glob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return records
