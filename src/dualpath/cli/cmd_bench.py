"""`dualpath bench --url URL --dataset 64k|FILE --agents N [--aps X] [--context-scale F] [--endpoint chat] [--json]`."""

from __future__ import annotations

import argparse
import json

from dualpath.cli.main import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "bench",
        help="replay agent trajectories against a running server (closed-loop clients)",
        description="Each agent sends its rounds in order: the whole context (earlier prompts + the tokens the "
        "server generated) plus the round's append, asking for exactly the round's generated tokens "
        "(paper A.3). Offline: all agents at once; --aps: Poisson arrivals.",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server address (default %(default)s)")
    parser.add_argument(
        "--dataset", default="64k", help="32k, 48k, 64k (paper Table 2 profiles) or a dataset file"
    )
    parser.add_argument("--agents", type=int, default=8, help="number of agents (default 8)")
    parser.add_argument(
        "--aps", type=float, default=None, help="online: agents per second (Poisson); default offline"
    )
    parser.add_argument(
        "--context-scale",
        type=float,
        default=None,
        help="token-count factor for the tiny model (default 1/32)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="replay only each trajectory's first N rounds"
    )
    parser.add_argument(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="completions: exact token ids each round (default); chat: messages through the chat template",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import httpx

    from dualpath.runtime.bench import DEFAULT_CONTEXT_SCALE, BenchOptions, format_summary
    from dualpath.runtime.bench import run as run_bench

    if args.agents < 1:
        raise UserError("--agents must be at least 1")
    if args.aps is not None and args.aps <= 0:
        raise UserError("--aps must be positive")
    scale = DEFAULT_CONTEXT_SCALE if args.context_scale is None else args.context_scale
    if not 0 < scale <= 1:
        raise UserError("--context-scale must lie in (0, 1]")
    options = BenchOptions(
        dataset=args.dataset,
        agents=args.agents,
        aps=args.aps,
        context_scale=scale,
        max_rounds=args.rounds,
        seed=args.seed,
        endpoint=args.endpoint,
    )
    try:
        httpx.get(f"{args.url}/health", timeout=10)
    except httpx.TransportError:
        raise UserError(f"no server answers at {args.url}; start one with `dualpath serve`") from None
    try:
        summary, _ = run_bench(args.url, options, progress=not args.json)
    except httpx.TransportError as error:  # it answered at the start: it stopped, or dropped a request
        why = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise UserError(
            f"the server at {args.url} stopped answering during the run ({why}); see its log"
        ) from None
    except RuntimeError as error:
        raise UserError(str(error)) from None
    except (KeyError, ValueError, OSError) as error:
        raise UserError(str(error).strip("'\"")) from None
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0
