"""`dualpath demo`: the README's main job — a real local cluster replaying an agentic trace per mode."""

from __future__ import annotations

import argparse
import json

DEMO_MODES = ("basic", "dualpath", "oracle")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "demo",
        help="start local-1p2d, replay a small agentic trace in basic, dualpath and oracle, print what it measured",
        description="Start the local-1p2d cluster (1 prefill node, 2 decode nodes, tiny model, KV store in a "
        "temporary folder, SNICs emulated at a low bandwidth so storage I/O is the bottleneck) once per mode, "
        "replay the same agentic trace, and print JCT, TTFT, throughput and per-node SNIC utilisation.",
    )
    parser.add_argument(
        "--engine",
        choices=("runtime", "vllm"),
        default="runtime",
        help="runtime: our serving runtime (default); vllm: a vLLM engine with DualPathConnector and 2 decode "
        "nodes' DE readers, basic vs dualpath (needs `make vllm`; docs/vllm.md; the other options do not apply)",
    )
    parser.add_argument(
        "--servers",
        action="store_true",
        help="with --engine vllm: 1 prefill + 2 decode `vllm serve` processes behind `dualpath route`, the "
        "trace replayed as `dualpath bench` does (minutes on 2 cores)",
    )
    parser.add_argument("--config", default="local-1p2d", help="cluster preset or TOML file")
    parser.add_argument("--agents", type=int, default=16, help="agents (default 16)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per agent (default 5)")
    parser.add_argument("--dataset", default="64k", help="trace profile or file (default 64k, scaled x 1/32)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--no-predict", action="store_true", help="skip the simulator's prediction (calibrated twin) per row"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return run_vllm(args)
    from dualpath.runtime.bench import BenchOptions
    from dualpath.runtime.experiment import demo_row, format_table, run_mode

    options = BenchOptions(dataset=args.dataset, agents=args.agents, max_rounds=args.rounds)
    rows = []
    for mode in DEMO_MODES:
        if not args.json:
            print(
                f"[{mode}] starting {args.config} and replaying {args.agents} agents x {args.rounds} rounds ...",
                flush=True,
            )
        rows.append(demo_row(run_mode(mode, options, config=args.config, progress=not args.json)))
    if not args.no_predict:  # the calibrated simulator on the same trace, beside each measured row
        from dualpath.cli.demo_twin import add_predictions, cached_calibration, format_predictions

        say = (lambda _: None) if args.json else (lambda text: print(text, flush=True))
        add_predictions(rows, cached_calibration(args.config, say=say), args.config, options)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
        if not args.no_predict:
            print(format_predictions(rows))
    return 0


def run_vllm(args: argparse.Namespace) -> int:
    import importlib.util

    from dualpath.cli.main import UserError
    from dualpath.integrations.vllm.paths import PathsOptions, format_summary, run_paths

    if importlib.util.find_spec("vllm") is None:
        raise UserError("--engine vllm needs the vLLM extra: make vllm (docs/vllm.md)")
    if args.servers:
        from dualpath.integrations.vllm.cluster_demo import (
            ClusterDemoOptions,
            format_cluster_summary,
            run_cluster_demo,
        )

        if args.json:
            print(json.dumps(run_cluster_demo(ClusterDemoOptions()), indent=2))
        else:
            say = lambda text: print(text, flush=True)  # noqa: E731
            print(format_cluster_summary(run_cluster_demo(ClusterDemoOptions(), say=say)))
        return 0
    if args.json:
        import os

        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout keeps the JSON only
        print(json.dumps(run_paths(PathsOptions()), indent=2))
    else:
        print(format_summary(run_paths(PathsOptions(), say=lambda text: print(text, flush=True))))
    return 0
