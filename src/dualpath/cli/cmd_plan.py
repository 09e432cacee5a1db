"""`dualpath plan`: closed-form answers for a hardware and model (paper §3 Table 1, §4.2, §8.2)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="bottleneck-free P/D range, link traffic, cache-compute ratio (Table 1), KV working set",
        description="Closed-form planning from the paper's §4.2 traffic analysis and Table 1.",
    )
    parser.add_argument("--hardware", help="hardware preset or .toml file (default: hopper-8x400g)")
    parser.add_argument("--model", help="model preset or .toml file (default: deepseek-v3.2)")
    parser.add_argument("--cluster", help="pd-cluster preset or .toml file (hardware + model + P/D)")
    parser.add_argument("--p", type=int, help="prefill nodes for the traffic table (default: 1)")
    parser.add_argument("--d", type=int, help="decode nodes for the traffic table (default: 1)")
    parser.add_argument("--context-tokens", help="an extra context length for the ratio, e.g. 32721 or 32K")
    parser.add_argument("--append-tokens", default="429", help="append per round (default: 429, Table 1)")
    parser.add_argument("--aps", type=float, help="working set: arrival rate in agents per second (§8.2)")
    parser.add_argument("--mean-jct", help="working set: mean job completion time, e.g. 20min")
    parser.add_argument("--mean-total-tokens", help="working set: mean final trajectory length, e.g. 55958")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    parser.add_argument("--table1", action="store_true", help="paper Table 1 for every model preset")
    parser.add_argument("--binary-k", action="store_true", help="with --table1: read 16K as 16,384 tokens")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from dualpath.cli.main import UserError
    from dualpath.config.coerce import ConfigError
    from dualpath.units import UnitError

    try:
        result, text = _table1(args) if args.table1 else _plan(args)
    except (ConfigError, UnitError) as error:
        raise UserError(str(error)) from None
    print(json.dumps(result, indent=2) if args.json else text)
    return 0


def _plan(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from dualpath.cli.main import UserError
    from dualpath.config.loader import load_cluster
    from dualpath.plan.report import plan, render_plan
    from dualpath.units import parse_duration, parse_tokens

    for flag in ("p", "d"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)}: expected a node count >= 1")
    cluster = load_cluster(
        args.cluster,
        hardware=args.hardware,
        model=args.model,
        num_prefill_nodes=args.p,
        num_decode_nodes=args.d,
        overrides=args.set,
    )
    working_set = None
    given = [args.aps is not None, args.mean_jct is not None, args.mean_total_tokens is not None]
    if any(given) and not all(given):
        raise UserError("the working set needs all of --aps, --mean-jct and --mean-total-tokens")
    if all(given):
        working_set = (args.aps, parse_duration(args.mean_jct), float(parse_tokens(args.mean_total_tokens)))
    result = plan(
        cluster.hardware,
        cluster.model,
        num_prefill_nodes=cluster.num_prefill_nodes,
        num_decode_nodes=cluster.num_decode_nodes,
        context_tokens=parse_tokens(args.context_tokens) if args.context_tokens else None,
        append_tokens=parse_tokens(args.append_tokens),
        working_set_inputs=working_set,
    )
    return result, render_plan(result)


def _table1(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from dualpath.config.loader import MODEL, load_model, preset_names
    from dualpath.plan.ratio import PAPER_TABLE1, TABLE1_BINARY_CONTEXTS
    from dualpath.plan.report import render_table1, table1

    names = (
        [args.model]
        if args.model
        else [*PAPER_TABLE1, *(n for n in preset_names(MODEL) if n not in PAPER_TABLE1)]
    )
    models = [load_model(n, args.set) for n in names]
    # Table 1 runs to a 64K context: models that cannot hold one (the tiny CPU models) are left out.
    longest = max(TABLE1_BINARY_CONTEXTS.values())
    models = [m for m in models if args.model or m.max_context_tokens >= longest]
    result = table1(models, binary_k=args.binary_k)
    return result, render_table1(result)
