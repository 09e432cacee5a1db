"""`dualpath validate`: runtime (measured) vs the calibrated simulator (predicted) on one trace (docs/twin.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

VALID_MODES = ("basic", "layerwise", "dualpath-rr", "dualpath", "oracle")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "validate",
        help="replay one trace on the runtime and on the calibrated simulator; measured vs predicted",
        description="Calibrate (quick) unless --calibration is given, then per mode replay the bench trace on a "
        "fresh local cluster and simulate the same trace with the calibrated cost model and the cluster's "
        "layout; print measured, predicted and error %% per metric.",
    )
    p.add_argument("--config", default="local-1p2d", help="runtime cluster preset or TOML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="cluster override")
    p.add_argument(
        "--calibration", type=Path, default=None, help="calibration preset (default: measure, quick)"
    )
    p.add_argument("--dataset", default="64k", help="trace profile or file (default 64k, scaled x 1/32)")
    p.add_argument("--agents", type=int, default=16, help="agents (default 16)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per agent (default 5)")
    p.add_argument("--aps", type=float, default=None, help="agent arrivals per second (default: offline)")
    p.add_argument("--seed", type=int, default=0, help="trace seed")
    p.add_argument("--modes", default="basic,dualpath,oracle", help="comma-separated modes")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs per mode, each on a fresh cluster; means are compared (default 3)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "-o", "--out", type=Path, default=None, metavar="DIR", help="write validate.json, ttft.png"
    )
    p.set_defaults(func=run)
    return p


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from dualpath.cli.main import UserError
    from dualpath.runtime.bench import BenchOptions
    from dualpath.runtime.cluster import ClusterConfigError, apply_settings, load_cluster

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in VALID_MODES]
    if not modes or bad:
        raise UserError(f"--modes {args.modes!r}: use a comma-separated list of {', '.join(VALID_MODES)}")
    if args.agents < 1 or args.rounds < 1 or args.repeat < 1:
        raise UserError("--agents, --rounds and --repeat must be >= 1")
    if args.aps is not None and args.aps <= 0:
        raise UserError("--aps must be positive")
    try:
        spec = apply_settings(load_cluster(args.config), list(args.set))
    except ClusterConfigError as error:
        raise UserError(str(error)) from None
    if args.calibration is not None and not args.calibration.is_file():
        raise UserError(f"--calibration {args.calibration}: no such file")
    try:
        from dualpath.workload import load_dataset

        load_dataset(args.dataset, seed=args.seed)
    except (ValueError, OSError) as error:
        raise UserError(f"--dataset {args.dataset!r}: {error}") from None

    from dualpath.cli.twin_tables import format_tables, plot_ttft
    from dualpath.twin.calibrate import calibrate
    from dualpath.twin.calibration import (
        CalibrationError,
        calibration_document,
        load_calibration,
        write_calibration,
    )
    from dualpath.twin.validate import layout, validate

    if args.calibration is None:
        _say(f"calibrating {spec.name} (quick) ...")
        cal = calibrate(spec, quick=True, threads=1)
        source = "measured now (quick)"
    else:
        try:
            cal = load_calibration(args.calibration)
        except CalibrationError as error:
            raise UserError(str(error)) from None
        source = str(args.calibration)
    options = BenchOptions(
        dataset=args.dataset, agents=args.agents, max_rounds=args.rounds, aps=args.aps, seed=args.seed
    )
    results = validate(spec, cal, options, modes, config=args.config, settings=args.set, progress=_say,
                       repeats=args.repeat)  # fmt: skip
    document = {
        "modes": {m: r.to_dict() for m, r in results.items()},
        "calibration": {"source": source, **calibration_document(cal)},
        "layout": layout(spec),
        "trace": {
            "dataset": args.dataset,
            "agents": args.agents,
            "rounds": args.rounds,
            "aps": args.aps,
            "seed": args.seed,
            "repeat": args.repeat,
        },
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "validate.json").write_text(json.dumps(document, indent=2, default=float))
        if args.calibration is None:  # reuse it: --calibration DIR/calibration.toml
            write_calibration(cal, args.out / "calibration.toml")
        plot_ttft(results, args.out / "ttft.png")
        _say(f"wrote {args.out / 'validate.json'} and {args.out / 'ttft.png'}")
    if args.json:
        print(json.dumps(document, default=float))
    else:
        print(format_tables(results))
    return 0
