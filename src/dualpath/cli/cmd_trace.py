"""`dualpath trace`: generate agentic datasets (paper Table 2, replay per A.3) and summarise trace files."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("trace", help="generate agentic traces and print their statistics")
    actions = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    generate = actions.add_parser("generate", help="write a Table 2 dataset (32k|48k|64k) as JSONL")
    generate.add_argument("--dataset", required=True, type=str.lower, choices=("32k", "48k", "64k"))
    generate.add_argument("--agents", type=int, default=500, help="trajectories to write (>500: A.3 replay)")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("-o", "--output", required=True, help="output .jsonl file")
    generate.set_defaults(func=_generate)

    stats = actions.add_parser("stats", help="summarise a trajectory JSONL or a Mooncake trace")
    stats.add_argument("file", help="a trace file, or a shipped trace's name (`dualpath trace list`)")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.add_argument("--skip-bad", action="store_true", help="skip malformed lines (and count them)")
    stats.set_defaults(func=_stats)

    listing = actions.add_parser("list", help="the traces shipped with the package, by name")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_list)
    return parser


def _generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np

    from dualpath.cli.main import UserError
    from dualpath.workload.generator import generate_dataset
    from dualpath.workload.jsonl import write_trajectories
    from dualpath.workload.trajectory import replay_trajectories

    if args.agents < 1:
        raise UserError(f"--agents must be >= 1, got {args.agents}")
    output = Path(args.output)
    if not output.parent.is_dir():
        raise UserError(f"{output.parent}: no such directory")
    dataset = generate_dataset(args.dataset, seed=args.seed)
    # A separate stream for replay sampling, so the dataset itself does not depend on --agents.
    replay_rng = np.random.default_rng([args.seed, 1])
    trajectories = replay_trajectories(dataset, args.agents, replay_rng)
    metadata = {"dataset": args.dataset, "seed": args.seed, "agents": args.agents}
    write_trajectories(output, trajectories, metadata)
    rounds = sum(t.num_rounds for t in trajectories)
    print(f"wrote {len(trajectories)} trajectories ({rounds:,} rounds) to {output}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    import json

    from dualpath.cli.main import UserError
    from dualpath.workload.datasets import load_trace
    from dualpath.workload.errors import TraceFormatError
    from dualpath.workload.shipped import resolve_trace
    from dualpath.workload.stats import format_table, request_stats, trajectory_stats

    try:
        path = resolve_trace(args.file)
    except FileNotFoundError as error:
        raise UserError(str(error)) from None
    try:
        loaded = load_trace(path, skip_bad=args.skip_bad)
    except TraceFormatError as error:
        raise UserError(str(error)) from None
    if loaded.trajectory_file is not None:
        summary = trajectory_stats(loaded.trajectory_file.trajectories)
    else:
        assert loaded.request_trace is not None
        summary = request_stats(loaded.request_trace)
    summary["skipped_lines"] = loaded.skipped_lines
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0


def _list(args: argparse.Namespace) -> int:
    import json

    from dualpath.workload.shipped import SHIPPED_TRACES, shipped_trace

    rows = [{"name": name, "path": str(shipped_trace(name))} for name in SHIPPED_TRACES]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(row["name"]) for row in rows)
        print("\n".join(f"{row['name']:<{width}}  {row['path']}" for row in rows))
    return 0
