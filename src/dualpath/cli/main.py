"""The `dualpath` command line.

Each subcommand lives in its own module `dualpath.cli.cmd_<name>` that defines
`add_parser(subparsers) -> argparse.ArgumentParser` and sets `func` (a callable taking the parsed
namespace and returning an exit code) with `parser.set_defaults(func=...)`. Driver imports happen
inside `func`, so `dualpath --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS = (
    "config",
    "plan",
    "trace",
    "simulate",
    "reproduce",
    "serve",
    "node",
    "bench",
    "demo",
    "calibrate",
    "validate",
    "sweep",
    "advise",
    "route",
)


class UserError(Exception):
    """Bad input from the user: printed as one clear line, exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dualpath", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"dualpath.cli.cmd_{name}")
        except ModuleNotFoundError as error:
            if error.name == f"dualpath.cli.cmd_{name}":
                continue  # that face of the product is not built yet
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as error:
        print(f"dualpath {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `dualpath ... | head`: the reader went away; that is not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    # `python -m dualpath.cli.main`: run the imported module's copy, so that `UserError` raised by the
    # subcommands (which import `dualpath.cli.main`) is the class caught here, not a second `__main__` copy.
    from dualpath.cli.main import run as _run

    _run()


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
