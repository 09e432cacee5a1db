"""`dualpath route --prefill URL ... [--de-endpoint NAME ...] [--mode basic|dualpath]`: an OpenAI-compatible
proxy in front of vLLM instances running DualPathConnector (docs/vllm.md)."""

from __future__ import annotations

import argparse

from dualpath.cli.main import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "route",
        help="OpenAI-compatible router in front of vLLM instances with DualPathConnector",
        description="Route each request to a vLLM prefill instance (Algorithm 1 on token load) and choose its "
        "read side (shorter storage read queue), with DualPath's policy code; the choice travels in the "
        "request's kv_transfer_params. See docs/vllm.md.",
    )
    parser.add_argument("--prefill", action="append", required=True, metavar="URL", help="a vLLM instance")
    parser.add_argument("--de-endpoint", action="append", default=[], metavar="NAME", help="a decode node")
    parser.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="URL",
        help="a decode instance (PD hand-off, docs/vllm.md)",
    )
    parser.add_argument(
        "--prefill-endpoint",
        action="append",
        default=[],
        metavar="NAME",
        help="the connector endpoint of each --prefill, in order (needed with --decode)",
    )
    parser.add_argument("--mode", choices=("basic", "dualpath"), default="dualpath")
    parser.add_argument("--store-dir", default="", help="the connectors' store directory (hit lengths)")
    parser.add_argument("--full-block-tokens", type=int, default=32)
    parser.add_argument("--alpha-tokens", type=float, default=float("inf"), help="Algorithm 1's α")
    parser.add_argument("--beta-tokens", type=float, default=float("inf"), help="Algorithm 1's β")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from dualpath.integrations.vllm.router import Router, RouterConfig, make_app

    if args.decode and len(args.prefill_endpoint) != len(args.prefill):
        raise UserError(
            "--decode needs one --prefill-endpoint per --prefill (the connectors' endpoint names)"
        )
    if args.full_block_tokens <= 0:
        raise UserError(f"--full-block-tokens must be positive, got {args.full_block_tokens}")
    config = RouterConfig(
        prefill_urls=tuple(u.rstrip("/") for u in args.prefill),
        de_endpoints=tuple(args.de_endpoint),
        decode_urls=tuple(u.rstrip("/") for u in args.decode),
        prefill_endpoints=tuple(args.prefill_endpoint),
        mode=args.mode,
        store_dir=args.store_dir,
        full_block_tokens=args.full_block_tokens,
        alpha_tokens=args.alpha_tokens,
        beta_tokens=args.beta_tokens,
    )
    uvicorn.run(make_app(Router(config)), host=args.host, port=args.port, log_level="warning")
    return 0
