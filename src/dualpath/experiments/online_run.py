"""One run of reproduce's online sweeps: `dualpath simulate` with the online early stop (sim/early_stop.py).

Usage (what `runner` runs for a spec with `early_stop_ttft_s`): python -m dualpath.experiments.online_run
simulate ARGS... --early-stop-ttft-s 4. Every other argument means what it means to `dualpath simulate`,
and the printed JSON is its `--json` object (with `stopped_early` and `stop_reason`).

NOTE: `dualpath simulate` has no early-stop flag (the rule is for sweeps that only ask "within the SLO
or not"), so this module builds the run itself from the same library calls as `cli/cmd_simulate.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from dualpath.cli.main import build_parser

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--early-stop-ttft-s", type=float, required=True)
    extra.add_argument("--early-stop-factor", type=float, default=2.0)
    rule_args, rest = extra.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(rest)
    if args.command != "simulate" or args.out is not None:
        print("online_run: expected `simulate ...` without -o", file=sys.stderr)
        return 2
    print(
        json.dumps(
            run(args, rule_args.early_stop_ttft_s, rule_args.early_stop_factor), sort_keys=True, default=str
        )
    )
    return 0


def run(args: argparse.Namespace, ttft_slo_s: float, factor: float) -> dict:  # type: ignore[type-arg]
    from dualpath.cli.cmd_simulate import _split_workload_sets
    from dualpath.cli.main import UserError
    from dualpath.config.loader import load_cluster
    from dualpath.engine.modes import MODES
    from dualpath.sim.agents import load_trajectories, scale_rounds
    from dualpath.sim.driver import SimConfig, Simulation
    from dualpath.sim.early_stop import EarlyStop
    from dualpath.sim.summary import summarise

    cluster_sets, scales = _split_workload_sets(args.set, UserError)
    cluster = load_cluster(hardware=args.hardware, model=args.model, num_prefill_nodes=args.p,
                           num_decode_nodes=args.d, overrides=cluster_sets)  # fmt: skip
    trajectories = scale_rounds(load_trajectories(args.dataset, args.agents, args.seed), **scales)
    config = SimConfig(cluster=cluster, mode=args.mode, read_path=args.read_path, aps=args.aps,
                       duration_s=args.duration, early_stop=EarlyStop(ttft_slo_s=ttft_slo_s, factor=factor))  # fmt: skip
    started = time.perf_counter()
    outcome = Simulation(config, trajectories, seed=args.seed).run()
    summary = summarise(outcome, offline=args.aps is None, wall_s=time.perf_counter() - started)
    summary.update(mode=args.mode, read_path=args.read_path or MODES[args.mode].read_path)
    return summary


if __name__ == "__main__":
    sys.exit(main())
