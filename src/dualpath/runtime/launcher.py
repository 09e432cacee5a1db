"""Starting and stopping runtime processes without leaving orphans or shared memory behind.

`spawn_node` starts one node as `python -m dualpath.runtime.node_main` (the same entry `dualpath node`
uses on other hosts). `ServeProcess` starts a whole local cluster as a `dualpath serve` child process — what
`dualpath demo`, `dualpath bench --spawn`, the benchmark and the tests use — and stops it with SIGTERM,
escalating to SIGKILL only after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import httpx

_STOP_GRACE_S = 10.0  # long enough for nodes to drain their writers and unlink shared memory


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes], grace_s: float = _STOP_GRACE_S) -> int:
    """SIGTERM, wait, then SIGKILL; returns the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def stop_processes(processes: list[subprocess.Popen[bytes]], grace_s: float = _STOP_GRACE_S) -> list[int]:
    """SIGTERM to all at once, then wait for each (SIGKILL after the shared grace): nodes drain in parallel,
    so stopping a cluster takes as long as its slowest node, not the sum."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
    return codes


def unlink_shared_memory(namespace: str) -> list[str]:
    """Remove what a killed node could not: its `dp_<namespace>_*` segments (Linux /dev/shm) and the socket
    files of its ipc endpoints (`dp_<namespace>_*.sock` in the temporary directory)."""
    removed = []
    places = [
        (Path("/dev/shm"), f"dp_{namespace}_*"),
        (Path(tempfile.gettempdir()), f"dp_{namespace}_*.sock"),
    ]
    for folder, pattern in places:
        if folder.is_dir():
            for path in sorted(folder.glob(pattern)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(path.name)
    return removed


def wait_healthy(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> dict:
    """The /health body once it says ok; raises if the server died or stayed unhealthy."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode} while starting")
        try:
            response = httpx.get(f"{url}/health", timeout=2.0)
            if response.status_code == 200:
                return dict(response.json())
            last = response.text
        except httpx.TransportError as error:
            last = str(error)
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} was not healthy after {timeout_s:.0f} s: {last}")


class ServeProcess:
    """`dualpath serve` as a child process; use as a context manager."""

    def __init__(
        self,
        config: str,
        *,
        mode: str | None = None,
        store_dir: Path | None = None,
        extra_args: tuple[str, ...] = (),
        start_timeout_s: float = 120.0,
        log_path: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [
            sys.executable,
            "-m",
            "dualpath.cli.main",
            "serve",
            "--config",
            config,
            "--port",
            str(self.port),
        ]
        if mode:
            args += ["--mode", mode]
        if store_dir is not None:
            args += ["--store", str(store_dir)]
        self._args = args + list(extra_args)
        self._timeout_s = start_timeout_s
        self._log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.health: dict = {}
        self._log: BinaryIO | None = None

    def __enter__(self) -> ServeProcess:
        self._log = open(self._log_path, "ab") if self._log_path else None  # noqa: SIM115 (closed in __exit__)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        out = self._log if self._log is not None else subprocess.DEVNULL
        self.process = subprocess.Popen(self._args, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            self.health = wait_healthy(self.url, self._timeout_s, self.process)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop_process(self.process)
        if self._log is not None:
            self._log.close()
