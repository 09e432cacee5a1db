"""`dualpath node --role prefill|decode --scheduler tcp://HOST:PORT --store DIR`: one node, for other hosts."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    from dualpath.runtime.node_main import add_node_arguments

    parser = subparsers.add_parser(
        "node",
        help="start one prefill or decode node that joins a running scheduler",
        description="Start one node process (its engine, DRAM buffer, emulated SNIC and CNIC) and join the "
        "scheduler at --scheduler. Use --tcp-host to serve KV over TCP when peers are on other hosts. A node "
        "that died (marked down by `serve`) joins a running scheduler again under its --name; the values "
        "for --scheduler, --store, --config and --namespace are in the server's GET /health under `join`.",
    )
    add_node_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from dualpath.runtime.node_main import run_reporting_start_errors

    return run_reporting_start_errors(args)
