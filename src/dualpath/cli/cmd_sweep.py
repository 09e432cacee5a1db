"""`dualpath sweep SPEC.toml [-o DIR] [--workers N | --ray auto|ADDRESS] [--set K=V]`: a declarative sweep."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from dualpath.cli.main import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "sweep",
        help="run a grid (or list) of simulator runs from a TOML spec; table, JSON, plots, report",
        description="Expand SPEC.toml (docs/capacity.md) into `dualpath simulate` runs, run those not already "
        "cached in DIR/runs (resumable), and write results.json, table.csv, one plot per metric and a "
        "report page. Specs shipped with the package: `dualpath sweep --list-shipped`.",
    )
    parser.add_argument("spec", nargs="?", help="sweep spec: a .toml file or the name of a shipped one")
    parser.add_argument(
        "-o", "--out", type=Path, default=None, help="output folder (default: out/sweep/NAME)"
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="parallel local simulations (default: cores)"
    )
    parser.add_argument(
        "--ray",
        metavar="auto|ADDRESS",
        default=None,
        help="run each simulation as a Ray task: 'auto' joins the running cluster or starts a local one",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override every run")
    parser.add_argument("--list", action="store_true", help="list the runs and exit")
    parser.add_argument(
        "--list-shipped", action="store_true", help="list the sweep specs shipped with dualpath"
    )
    parser.add_argument("--report-only", action="store_true", help="write the outputs from cached runs only")
    parser.add_argument("--json", action="store_true", help="print results.json instead of the table")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from dualpath.experiments.runner import failed, load_cached, run_all
    from dualpath.experiments.sweep import SweepError, load_sweep, shipped_specs
    from dualpath.experiments.sweep_report import write_sweep

    if args.list_shipped:
        for name, path in shipped_specs().items():
            print(f"{name:<24} {path}")
        return 0
    if not args.spec:
        raise UserError("give a sweep spec (a .toml file or a shipped name; see --list-shipped)")
    path = Path(args.spec)
    if not path.exists() and args.spec in shipped_specs():
        path = shipped_specs()[args.spec]
    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be >= 1")
    try:
        sweep = load_sweep(path, extra_sets=args.set, trace_dir=(args.out or Path("out")) / "traces")
    except SweepError as error:
        raise UserError(str(error)) from None
    if args.list:
        for spec in dict.fromkeys(sweep.specs()):
            print(spec.label())
        return 0
    out = args.out or Path("out/sweep") / sweep.name
    unique = {spec.key() for spec in sweep.specs()}
    cached = sum((out / "runs" / f"{key}.json").exists() for key in unique)
    started = time.perf_counter()
    if args.report_only:
        outcomes = load_cached(sweep.specs(), out / "runs")
    else:
        try:
            outcomes = run_all(sweep.specs(), out / "runs", workers=args.workers, progress=not args.quiet,
                               ray_address=args.ray)  # fmt: skip
        except RuntimeError as error:  # no ray installed
            raise UserError(str(error)) from None
    wall_s = time.perf_counter() - started
    where = f"Ray ({args.ray})" if args.ray else f"{args.workers or 'all'} local workers"
    header = (
        f"{len(unique)} simulator runs ({cached} from the cache in {out / 'runs'}) in {wall_s:.0f} s on "
        f"{platform.node()} with {where}; spec {path}."
    )
    paths = write_sweep(sweep, outcomes, out, header)
    if args.json:
        print(paths["json"].read_text(), end="")
    else:
        print(paths["markdown"].read_text().split("\n![")[0])
        print(f"outputs: {paths['json']}  {paths['csv']}  {paths['html']}  ({wall_s:.0f} s)")
    bad = failed(outcomes.values())
    for outcome in bad:
        print(
            f"run failed ({outcome.attempts} attempts): {outcome.spec.label()}: {outcome.error}",
            file=sys.stderr,
        )
    missing = len(unique) - len(outcomes)
    if missing and args.report_only:
        print(f"{missing} runs have no cached result", file=sys.stderr)
    return 1 if bad else 0
