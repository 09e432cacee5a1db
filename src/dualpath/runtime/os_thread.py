"""Give the calling thread its name at the OS level too (Linux `prctl(PR_SET_NAME)`), so that `top -H`,
`py-spy` and /proc/PID/task/TID/stat show which thread of a node is its engine.

Python names threads for itself only; the kernel keeps the process's name for every thread. The twin's
calibration (`twin/calibration_runtime.py`) tells a node's engine thread from its I/O threads by this
name. A no-op where the call is not available (not Linux, no libc).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

_PR_SET_NAME = 15
_MAX_NAME_BYTES = 15  # the kernel's TASK_COMM_LEN is 16 with the terminating zero

ENGINE_THREAD_NAMES = ("pe-worker", "de-decode")


def name_os_thread(name: str) -> bool:
    """Set the calling thread's OS name (truncated to 15 bytes); True when it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_NAME, name.encode()[:_MAX_NAME_BYTES], 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class EngineWork:
    """An engine thread's work pieces (a forward, a decode run): how many, their wall time and the CPU
    time the thread itself spent in them. Wall beyond CPU is time the piece was runnable but not running
    (shared cores, the GIL held by the process's other threads) or waiting (a load; a store write the
    piece must see land is taken out, `waiting`). Read by /metrics and the twin's calibration; only the
    engine thread writes, any thread reads a snapshot.
    """

    def __init__(self) -> None:
        self.pieces = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0

    @contextmanager
    def timed(self) -> Iterator[None]:
        wall0, cpu0 = time.monotonic(), time.thread_time()
        try:
            yield
        finally:
            self.cpu_s += time.thread_time() - cpu0
            self.wall_s += time.monotonic() - wall0
            self.pieces += 1

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Inside a piece: a wait that is not the engine's work (a store write it must see land); its
        wall time leaves the piece's wall."""
        wall0 = time.monotonic()
        try:
            yield
        finally:
            self.wall_s -= time.monotonic() - wall0

    def stats(self) -> dict[str, float]:
        return {"engine_pieces": float(self.pieces), "engine_wall_s": self.wall_s, "engine_cpu_s": self.cpu_s}
