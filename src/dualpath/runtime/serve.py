"""`dualpath serve`: the scheduler process (this one) plus one child process per node, stopped cleanly.

Shutdown (Ctrl-C / SIGTERM): uvicorn stops the HTTP server (streams in flight get the rest of the
`--shutdown-grace` period), then every node gets SIGTERM (it drains, closes its transfer endpoint and
unlinks its shared memory), stragglers get SIGKILL when the grace period is over (a second SIGTERM:
at once), and any `dp_<namespace>_*` segment a killed node left behind is unlinked here. No orphan
processes remain. A node that dies at start-up stops `serve` with exit status 1; one that dies later is
marked down, its work re-planned (`ClusterCore.on_node_down`), and `dualpath node` may join it again.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from dualpath.runtime.cluster import ClusterConfigError, RuntimeClusterSpec, dump_cluster
from dualpath.runtime.launcher import stop_processes, unlink_shared_memory
from dualpath.runtime.limits import ServeLimits
from dualpath.runtime.scheduler import SMALLEST_SERVED_REQUEST, ClusterScheduler, serve_scheduler

SHUTDOWN_GRACE_S = 10.0  # `--shutdown-grace`: how long SIGTERM waits for requests in flight and nodes
_NODE_STOP_MIN_S = 1.0  # nodes always get this long to drain and unlink shared memory before SIGKILL


def node_command(
    *,
    name: str,
    role: str,
    scheduler: str,
    store_dir: Path,
    config: str,
    namespace: str,
    tcp_host: str | None = None,
) -> list[str]:
    args = [sys.executable, "-m", "dualpath.runtime.node_main", "--name", name, "--role", role]
    args += [
        "--scheduler",
        scheduler,
        "--store",
        str(store_dir),
        "--config",
        config,
        "--namespace",
        namespace,
    ]
    return args + (["--tcp-host", tcp_host] if tcp_host else [])


def preflight(spec: RuntimeClusterSpec) -> None:
    """What can be checked before any node starts (a node's own failure stops `serve` too, later): the
    model is a model preset or a folder; a default request fits a DE's HBM (the DRAM buffer is checked
    once the nodes tell the KV size, `ClusterScheduler.admission_error`). Raises ClusterConfigError."""
    from dualpath.config.loader import MODEL, preset_names

    if not Path(spec.model).is_dir() and spec.model not in preset_names(MODEL):
        raise ClusterConfigError(
            f"model {spec.model!r} is neither a model folder nor a preset ({', '.join(preset_names(MODEL))})"
        )
    prompt_tokens, max_tokens = SMALLEST_SERVED_REQUEST
    if prompt_tokens + max_tokens > spec.hbm_tokens:
        raise ClusterConfigError(
            f"hbm_tokens = {spec.hbm_tokens} cannot hold even a {prompt_tokens}-token prompt and "
            f"{max_tokens} output tokens; give a decode engine at least {prompt_tokens + max_tokens}"
        )


def serve(
    spec: RuntimeClusterSpec,
    *,
    config: str,
    host: str,
    port: int,
    store_dir: Path | None,
    spawn_nodes: bool = True,
    control_port: int = 0,
    tcp_data_plane: bool = False,
    event_log_path: Path | None = None,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
    limits: ServeLimits | None = None,
) -> int:
    """Run until SIGINT/SIGTERM (exit status 0) or until a node process or the control loop fails (1).
    `config` names the cluster for the log; nodes get the resolved spec."""
    remove_stale_run_dirs()
    with ExitStack() as stack:
        if store_dir is None:
            store_dir = Path(stack.enter_context(_run_dir("store")))
        namespace = f"{os.getpid()}{uuid.uuid4().hex[:6]}"
        run_dir = Path(stack.enter_context(_run_dir("run")))
        config = str(run_dir / "cluster.toml")  # the resolved spec: nodes see every override
        Path(config).write_text(dump_cluster(spec))
        scheduler = ClusterScheduler(spec, store_dir, event_log_path=event_log_path, limits=limits)
        children: list[subprocess.Popen[bytes]] = []

        def start_nodes(address: str) -> None:
            print(
                f"dualpath serve: {spec.name} ({scheduler.mode}) on http://{host}:{port}, control {address}",
                flush=True,
            )
            scheduler.join_info = {"scheduler": address, "store": str(store_dir), "config": config,
                                   "namespace": namespace}  # fmt: skip
            if not spawn_nodes:
                return
            for name, role in spec.node_ids():
                cmd = node_command(
                    name=name,
                    role=role,
                    scheduler=address,
                    store_dir=store_dir,
                    config=config,
                    namespace=namespace,
                    tcp_host="127.0.0.1" if tcp_data_plane else None,
                )
                cmd += ["--parent-pid", str(os.getpid())]
                children.append(subprocess.Popen(cmd))

        # uvicorn re-raises the signal it caught once the server has stopped; turning SIGTERM into
        # KeyboardInterrupt lets the `finally` below stop the nodes instead of dying with them orphaned.
        signal.signal(signal.SIGTERM, _interrupt)
        stopping = Shutdown(children, shutdown_grace_s)
        exited: set[int] = set()

        def node_exits() -> list[tuple[str, str]]:
            """Spawned nodes that died once serving began: marked down, their work re-planned; `dualpath
            node` (or a restart of it) joins again under the same name."""
            if scheduler.driver is None:
                return []
            out = []
            for child, (name, _) in zip(children, spec.node_ids(), strict=False):
                if child.poll() is not None and child.pid not in exited:
                    exited.add(child.pid)
                    out.append((name, f"pid {child.pid} exited with status {child.returncode}"))
            return out

        def start_failure() -> str | None:  # before serving began, a dead node stops `serve` (status 1)
            return _dead_child(children, spec.node_ids()) if scheduler.driver is None else None

        failure: str | None = None
        try:
            failure = asyncio.run(
                serve_scheduler(
                    scheduler,
                    http_host=host,
                    http_port=port,
                    control_address=f"tcp://{'0.0.0.0' if not spawn_nodes else '127.0.0.1'}:{control_port}",
                    on_bound=start_nodes,
                    check=start_failure,
                    node_exits=node_exits,
                    shutdown_grace_s=shutdown_grace_s,
                    on_signal=stopping.begin,
                )
            )
        except KeyboardInterrupt:
            pass
        finally:
            stopping.stop_nodes()
            unlink_shared_memory(namespace)
    return 1 if failure else 0


class Shutdown:
    """The shutdown deadline: `grace_s` after the first SIGINT/SIGTERM the HTTP side has stopped waiting
    for streams and the nodes get what is left (at least `_NODE_STOP_MIN_S` to drain and unlink their
    shared memory), then SIGKILL. A further SIGTERM/SIGINT while nodes stop kills them at once."""

    def __init__(self, children: list[subprocess.Popen[bytes]], grace_s: float) -> None:
        self.children = children
        self.grace_s = grace_s
        self.deadline: float | None = None

    def begin(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.grace_s

    def stop_nodes(self) -> None:
        self.begin()
        assert self.deadline is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._force)
        try:
            stop_processes(self.children, max(_NODE_STOP_MIN_S, self.deadline - time.monotonic()))
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _force(self, signum: int, frame: object) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _dead_child(children: list[subprocess.Popen[bytes]], names: list[tuple[str, str]]) -> str | None:
    for child, (name, _) in zip(children, names, strict=False):
        if child.poll() is not None:
            return f"node {name} (pid {child.pid}) exited with status {child.returncode}"
    return None


# ---- temporary folders ---------------------------------------------------------------------------
# `dualpath-run-<pid>-*` / `dualpath-store-<pid>-*` in the system temp dir: removed on any exit this
# process lives through; after a SIGKILL the next `serve` removes those whose owner process is gone.


def _run_dir(kind: str) -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix=f"dualpath-{kind}-{os.getpid()}-")


def remove_stale_run_dirs(temp_dir: Path | None = None) -> list[str]:
    """Remove the temporary folders of `serve` processes that no longer run; returns their names."""
    removed = []
    for path in sorted(Path(temp_dir or tempfile.gettempdir()).glob("dualpath-*-*-*")):
        match = _RUN_DIR.fullmatch(path.name)
        if match is None or not path.is_dir() or path.is_symlink() or _alive(int(match["pid"])):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


_RUN_DIR = re.compile(r"dualpath-(run|store)-(?P<pid>[0-9]+)-[A-Za-z0-9_]+")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
