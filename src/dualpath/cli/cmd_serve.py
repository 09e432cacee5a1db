"""`dualpath serve [--config FILE|PRESET] [--mode M] [--model PRESET|DIR] [--port N]`: a real local DualPath
cluster."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from dualpath.cli.main import UserError
from dualpath.policy.read_path import READ_PATH_POLICIES
from dualpath.runtime.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WAITING, ServeLimits

MODES = ("basic", "layerwise", "dualpath-rr", "dualpath", "oracle")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "serve",
        help="start a local cluster: scheduler + HTTP API, one process per node",
        description="Start the scheduler (OpenAI-compatible HTTP API) and one process per prefill/decode node. "
        "Storage and compute NICs are EMULATED by rate limiters (see docs/runtime.md). Ctrl-C stops everything.",
    )
    parser.add_argument(
        "--config", default="local-1p2d", help="cluster preset or TOML file (default local-1p2d)"
    )
    parser.add_argument("--mode", choices=MODES, help="serving mode (default: the cluster file's)")
    parser.add_argument(
        "--model",
        help="model preset (tiny-llama) or a local Hugging Face model folder: config.json, *.safetensors, "
        "tokenizer.json (default: the cluster file's); never downloaded",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="weights and KV cache type (default: the preset's, or the folder's torch_dtype)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where the nodes compute (default cpu)")
    parser.add_argument(
        "--read-path", choices=sorted(READ_PATH_POLICIES), help="read-path policy for dualpath/oracle"
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument(
        "--store", type=Path, help="KV store directory, shared by all nodes (default: a temp dir)"
    )
    parser.add_argument(
        "--control-port", type=int, default=0, help="control-plane port (default: any free one)"
    )
    parser.add_argument(
        "--no-spawn",
        action="store_true",
        help="start no nodes here; they join with `dualpath node --scheduler ...`",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a cluster field, e.g. snic_bytes_per_s=8MB/s",
    )
    parser.add_argument("--tcp", action="store_true", help="move KV over ZeroMQ TCP instead of shared memory")
    parser.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="on SIGTERM/Ctrl-C, wait at most S seconds for requests in flight and nodes (default 10); "
        "a second signal stops at once",
    )
    parser.add_argument(
        "--request-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="end a request still unfinished S seconds after it arrived with an error (504) and cancel it "
        "(default: no deadline)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help=f"refuse larger request bodies with 413 (default {DEFAULT_MAX_BODY_BYTES})",
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=DEFAULT_MAX_WAITING,
        metavar="N",
        help=f"answer 429 (Retry-After) while N requests wait for placement (default {DEFAULT_MAX_WAITING})",
    )
    parser.add_argument(
        "--event-log",
        type=Path,
        help="on exit, write the driver's config, input events, messages and decisions here (JSON, replayable)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from dualpath.runtime.cluster import ClusterConfigError, apply_settings, load_cluster
    from dualpath.runtime.model_host import resolve_model
    from dualpath.runtime.serve import preflight, serve

    try:
        spec = load_cluster(args.config)
        if args.mode:
            spec = replace(spec, mode=args.mode)
        if args.read_path:
            spec = replace(spec, read_path=args.read_path)
        for key in ("model", "dtype", "device"):
            if getattr(args, key):
                spec = replace(spec, **{key: getattr(args, key)})
        spec = apply_settings(spec, args.set)
        spec = replace(spec, model=resolve_model(spec.model))  # a folder: absolute, its files checked
        preflight(spec)
    except (ClusterConfigError, FileNotFoundError) as error:
        raise UserError(str(error)) from None
    try:
        limits = ServeLimits(
            max_body_bytes=args.max_body_bytes,
            max_waiting=args.max_waiting,
            request_timeout_s=args.request_timeout or None,
        )
    except ValueError as error:
        raise UserError(str(error)) from None
    if args.no_spawn and args.store is None:
        raise UserError(
            "--no-spawn needs --store DIR: the directory every node mounts as the shared KV store"
        )
    return serve(
        spec,
        config=args.config,
        host=args.host,
        port=args.port,
        store_dir=args.store,
        spawn_nodes=not args.no_spawn,
        control_port=args.control_port,
        tcp_data_plane=args.tcp,
        event_log_path=args.event_log,
        shutdown_grace_s=args.shutdown_grace,
        limits=limits,
    )


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value
