"""The `dualpath` command line.

Each subcommand lives in its own module `dualpath.cli.cmd_<name>` that defines
`add_parser(subparsers) -> argparse.ArgumentParser` and sets `func` (a callable taking the parsed
namespace and returning an exit code) with `parser.set_defaults(func=...)`. Driver imports happen
inside `func`, so `dualpath --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
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
    return _main(argv)[0]


def _main(argv: Sequence[str] | None) -> tuple[int, argparse.Namespace | None]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2, None
    return _call(args), args


def _call(args: argparse.Namespace) -> int:
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
    """Console-script entry point.

    A subcommand whose parser sets `exit_without_teardown` (`dualpath simulate`: a 48P96D run leaves
    ≈ 5 GB of records) ends the process once its output is flushed, without the interpreter freeing every
    object one by one (tens of seconds at that size, after the result is out; nothing else is skipped:
    its files are written and closed, and it starts no threads or children).
    """
    code, args = _main(None)
    if getattr(args, "exit_without_teardown", False):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader that went away, or closed above
                stream.flush()
        os._exit(code)
    sys.exit(code)
