"""`dualpath reproduce EXPERIMENT|all [-o DIR] [--quick] [--workers N]`: the paper's experiments."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from dualpath.cli.main import UserError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    from dualpath.experiments.scenarios import EXPERIMENTS

    parser = subparsers.add_parser(
        "reproduce",
        help="run the paper's experiments on the simulator and write a report",
        description="Run each experiment of the paper as a named simulator scenario; write tables, JSON, "
        "plots and a report page beside the paper's headline claims. Finished runs are cached "
        "in DIR/runs, so an interrupted reproduce resumes.",
    )
    parser.add_argument(
        "experiments", nargs="+", metavar="EXPERIMENT", help=f"one or more of: all, {', '.join(EXPERIMENTS)}"
    )
    parser.add_argument("-o", "--out", type=Path, default=Path("out/reproduce"), help="output folder")
    parser.add_argument("--quick", action="store_true", help="smaller sweeps (minutes instead of hours)")
    parser.add_argument("--workers", type=int, default=None, help="parallel simulations (default: cores)")
    parser.add_argument(
        "--ray",
        metavar="auto|ADDRESS",
        default=None,
        help="run each simulation as a Ray task (docs/capacity.md)",
    )
    parser.add_argument("--list", action="store_true", help="list the runs and exit")
    parser.add_argument("--report-only", action="store_true", help="write the report from cached runs only")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from dualpath.experiments.report import write_report
    from dualpath.experiments.runner import failed, load_cached, run_all
    from dualpath.experiments.scenarios import EXPERIMENTS

    names = list(EXPERIMENTS) if "all" in args.experiments else args.experiments
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise UserError(f"unknown experiment {', '.join(unknown)}; choose from all, {', '.join(EXPERIMENTS)}")
    experiments = [EXPERIMENTS[n] for n in names]
    specs = [spec for e in experiments for spec in e.specs(args.quick)]
    if args.list:
        for spec in dict.fromkeys(specs):
            print(spec.label())
        return 0
    started = time.perf_counter()
    unique = {spec.key(): spec for spec in specs}
    cached = sum((args.out / "runs" / f"{key}.json").exists() for key in unique)
    if args.report_only:
        outcomes = load_cached(specs, args.out / "runs")
    else:
        try:
            outcomes = run_all(specs, args.out / "runs", workers=args.workers, ray_address=args.ray)
        except RuntimeError as error:  # --ray without ray installed
            raise UserError(str(error)) from None
    results = {key: outcome.result for key, outcome in outcomes.items() if outcome.result is not None}
    sections = [e.analyze(results, args.quick, args.out / "plots") for e in experiments]
    for experiment, section in zip(experiments, sections, strict=True):
        mine = {spec.key() for spec in experiment.specs(args.quick)}
        if args.report_only:
            section.notes += [
                f"no cached result (failed, stopped or never run): {spec.label()}"
                for spec in dict.fromkeys(experiment.specs(args.quick))
                if spec.key() not in outcomes
            ]
        section.notes += [
            f"run failed: {o.spec.label()}: {o.error}"
            for o in failed(outcomes.values())
            if o.spec.key() in mine
        ]
    wall_s = time.perf_counter() - started
    executor = f"Ray {args.ray}" if args.ray else f"{args.workers or 'all'} workers"
    header = (
        f"{len(outcomes)} simulator runs ({cached} of them from the cache in {args.out / 'runs'}) in "
        f"{wall_s:.0f} s on {platform.node()} ({platform.processor() or platform.machine()}, "
        f"{executor})."
    )
    paths = write_report(args.out, sections, quick=args.quick, header=header)
    for section in sections:
        print(f"\n== {section.title} ({section.paper_ref})\n{section.text_table()}")
    for outcome in failed(outcomes.values()):
        print(f"run failed: {outcome.spec.label()}: {outcome.error}", file=sys.stderr)
    print(f"\nreport: {paths['markdown']}  {paths['html']}  {paths['json']}  ({wall_s:.0f} s)")
    return 1 if failed(outcomes.values()) else 0
