"""`dualpath calibrate`: measure this machine for the runtime's cluster, write a simulator preset (docs/twin.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "calibrate", help="measure the runtime's model, links and store here; write a cost-model preset"
    )
    p.add_argument("--config", default="local-1p2d", help="runtime cluster preset or TOML file")
    p.add_argument("--quick", action="store_true", help="fewer shapes and repeats (< 1 minute)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (a node process uses 1)")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="PRESET.toml", help="preset to write")
    p.add_argument("--store-dir", type=Path, default=None, help="folder for the FileStore test blocks")
    p.add_argument(
        "--no-runtime",
        action="store_true",
        help="skip the in-situ CPU factors (replays of a training trace on a local cluster, ~40 s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from dualpath.cli.main import UserError
    from dualpath.cli.twin_tables import format_report
    from dualpath.runtime.cluster import ClusterConfigError, load_cluster
    from dualpath.twin.calibrate import RUNTIME_MODES, calibrate, num_steps
    from dualpath.twin.calibration import calibration_document, write_calibration

    if args.threads < 1:
        raise UserError("--threads must be >= 1")
    if args.out.suffix != ".toml":
        raise UserError(f"-o {args.out}: the preset must be a .toml file")
    try:
        cluster = load_cluster(args.config)
    except ClusterConfigError as error:
        raise UserError(str(error)) from None
    if args.store_dir is not None and not args.store_dir.is_dir():
        raise UserError(f"--store-dir {args.store_dir}: no such folder")
    from tqdm import tqdm

    runtime_modes = () if args.no_runtime else RUNTIME_MODES
    with tqdm(
        total=num_steps(args.quick, len(runtime_modes)), file=sys.stderr, disable=args.quiet, unit="step"
    ) as bar:

        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        calibration = calibrate(cluster, quick=args.quick, threads=args.threads, tick=tick,
                                store_dir=args.store_dir, runtime_modes=runtime_modes)  # fmt: skip
    write_calibration(calibration, args.out)
    if args.json:
        document = calibration_document(calibration)
        print(json.dumps({"preset": str(args.out), **document}))
    else:
        print(format_report(calibration))
        print(f"wrote {args.out}")
    return 0
