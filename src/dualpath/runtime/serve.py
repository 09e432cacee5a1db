"""`dualpath serve`: the scheduler process (this one) plus one child process per node, stopped cleanly.

Shutdown (Ctrl-C / SIGTERM): uvicorn stops the HTTP server, then every node gets SIGTERM (it drains, closes
its transfer endpoint and unlinks its shared memory), stragglers get SIGKILL after a grace period, and
any `dp_<namespace>_*` segment a killed node left behind is unlinked here. No orphan processes remain.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path

from dualpath.runtime.cluster import RuntimeClusterSpec, dump_cluster
from dualpath.runtime.launcher import stop_processes, unlink_shared_memory
from dualpath.runtime.scheduler import ClusterScheduler, serve_scheduler


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
) -> int:
    """Run until SIGINT/SIGTERM. `config` names the cluster for the log; nodes get the resolved spec."""
    with ExitStack() as stack:
        if store_dir is None:
            store_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dualpath-store-")))
        namespace = f"{os.getpid()}{uuid.uuid4().hex[:6]}"
        run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dualpath-run-")))
        config = str(run_dir / "cluster.toml")  # the resolved spec: nodes see every override
        Path(config).write_text(dump_cluster(spec))
        scheduler = ClusterScheduler(spec, store_dir, event_log_path=event_log_path)
        children: list[subprocess.Popen[bytes]] = []

        def start_nodes(address: str) -> None:
            print(
                f"dualpath serve: {spec.name} ({scheduler.mode}) on http://{host}:{port}, control {address}",
                flush=True,
            )
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
        try:
            asyncio.run(
                serve_scheduler(
                    scheduler,
                    http_host=host,
                    http_port=port,
                    control_address=f"tcp://{'0.0.0.0' if not spawn_nodes else '127.0.0.1'}:{control_port}",
                    on_bound=start_nodes,
                    check=lambda: _dead_child(children),
                )
            )
        except KeyboardInterrupt:
            pass
        finally:
            stop_processes(children)
            unlink_shared_memory(namespace)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _dead_child(children: list[subprocess.Popen[bytes]]) -> str | None:
    for child in children:
        if child.poll() is not None:
            return f"node process {child.pid} exited with status {child.returncode}"
    return None
