"""Entry point of one node process: `python -m dualpath.runtime.node_main` (also `dualpath node`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dualpath.runtime.cluster import ROLES


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", choices=ROLES, required=True, help="prefill (PE) or decode (DE)")
    parser.add_argument("--scheduler", required=True, help="the scheduler's control address, tcp://HOST:PORT")
    parser.add_argument(
        "--name", help="node id in the cluster file (p0, d1, ...); default: first of its role"
    )
    parser.add_argument(
        "--config", default="local-1p2d", help="cluster preset or TOML file (same as the scheduler's)"
    )
    parser.add_argument(
        "--store", type=Path, required=True, help="the shared KV store directory (the 3FS mount)"
    )
    parser.add_argument("--namespace", default="dp", help="shared-memory namespace of this host's nodes")
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)  # exit with `serve`
    parser.add_argument(
        "--tcp-host",
        default=None,
        help="serve KV over ZeroMQ TCP on this host address (nodes on other hosts)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    from dualpath.runtime.cluster import load_cluster
    from dualpath.runtime.node import NodeOptions, run_node

    spec = load_cluster(args.config)
    name = args.name or next(n for n, role in spec.node_ids() if role == args.role)
    options = NodeOptions(
        name=name,
        role=args.role,
        scheduler_address=args.scheduler,
        store_dir=args.store,
        namespace=args.namespace,
        tcp_host=args.tcp_host,
        parent_pid=args.parent_pid,
    )
    return run_node(options, spec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dualpath-node")
    add_node_arguments(parser)
    return run_reporting_start_errors(parser.parse_args(argv))


def run_reporting_start_errors(args: argparse.Namespace) -> int:
    """`run_from_args`, with a start-up failure as one line on stderr and exit status 2 (`serve`
    relays the status and stops), not a traceback."""
    from dualpath.runtime.cluster import ClusterConfigError
    from dualpath.runtime.node import NodeStartError

    try:
        return run_from_args(args)
    except (NodeStartError, ClusterConfigError) as error:
        print(f"dualpath node {args.name or args.role}: cannot start: {error}", file=sys.stderr, flush=True)
        return 2


def _exit_now(code: int) -> None:
    """Leave without the interpreter's native teardown. `run_node` has already closed everything that
    matters (writer drained: every write durable; shared memory unlinked; sockets closed, linger 0);
    what is left took 2.4-2.8 s per node after SIGTERM on the 2-core host (native finalizers, measured
    with faulthandler: no Python frame), most of a cluster's shutdown time against a 10 s kill limit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
