"""`dualpath advise`: the smallest P×D that meets a TTFT/TPOT SLO at a load, in dualpath and basic mode."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from dualpath.cli.main import UserError

# Online runs stop early past max(target, 4 s): a stopped run's mean TTFT (and, TTFT being right-skewed, its
# p90) is past any target up to 4 s (the paper's SLO), and all targets up to 4 s share one cache entry per run.
EARLY_STOP_FLOOR_S = 4.0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "advise",
        help="smallest cluster (P x D) meeting a latency SLO at a target load, dualpath vs basic",
        description="Search (not a grid) for the fewest nodes, then the P/D split, whose simulation meets "
        "the SLO, per mode: splits inside the planner's bottleneck-free P/D range, node counts doubled "
        "then bisected. Prints the recommendation, DualPath's node saving, the binding link and the "
        "evidence runs (cached in DIR/runs). docs/capacity.md.",
    )
    p.add_argument("--hardware", default="hopper-8x400g", help="hardware preset or TOML file")
    p.add_argument("--model", default="deepseek-v3.2", help="model preset or TOML file")
    workload = p.add_mutually_exclusive_group()
    workload.add_argument("--dataset", default=None, help="32k | 48k | 64k | FILE (default 64k)")
    workload.add_argument(
        "--trace",
        default=None,
        help="a shipped trace's name (`dualpath trace list`), a trajectory file or a Mooncake trace "
        "(one agent per session)",
    )
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--aps", type=float, help="online: Poisson agent arrivals per second")
    load.add_argument("--agents", type=int, help="offline: this many agents at once")
    p.add_argument("--duration", default="1800s", help="online run length (default 1800s)")
    p.add_argument("--ttft-p90", required=True, help="SLO: TTFT p90 target, e.g. 4s")
    p.add_argument("--tpot", "--tpot-p90", dest="tpot", default=None, help="SLO: TPOT p90 target, e.g. 50ms")
    p.add_argument("--modes", default="dualpath,basic", help="modes to size (default dualpath,basic)")
    p.add_argument("--max-nodes", type=int, default=64, help="give up above this many nodes (default 64)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=None, help="parallel simulations (default: cores)")
    p.add_argument("--ray", metavar="auto|ADDRESS", default=None, help="run simulations as Ray tasks")
    p.add_argument("--no-links", action="store_true", help="do not record links (no binding link is named)")
    p.add_argument("-o", "--out", type=Path, default=Path("out/advise"), help="run cache and link records")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from dualpath.experiments.advise import Problem, Slo, advise, render
    from dualpath.experiments.runner import default_workers

    problem = _problem(args, Problem, Slo)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    _check_modes(modes)
    started = time.perf_counter()

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        result = advise(problem, modes, args.out, workers=args.workers or default_workers(),
                        ray_address=args.ray, log=log, progress=True)  # fmt: skip
    except RuntimeError as error:  # --ray without ray installed
        raise UserError(str(error)) from None
    result["wall_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(render(result) + f" in {result['wall_s']:.0f} s (cache: {args.out / 'runs'})")
    return 0 if all(result[m]["meets_slo"] for m in modes) else 1


def _problem(args: argparse.Namespace, problem: Any, slo: Any) -> Any:
    from dualpath.config.coerce import ConfigError
    from dualpath.config.loader import load_cluster
    from dualpath.experiments.runspec import RunSpec
    from dualpath.plan.bounds import pd_range
    from dualpath.units import UnitError, parse_duration

    try:
        duration_s = parse_duration(args.duration)
        ttft = parse_duration(args.ttft_p90)
        tpot = parse_duration(args.tpot) if args.tpot else None
        cluster_sets = [s for s in args.set if not s.startswith("workload.")]
        cluster = load_cluster(hardware=args.hardware, model=args.model, num_prefill_nodes=1,
                               num_decode_nodes=1, overrides=cluster_sets)  # fmt: skip
    except (ConfigError, UnitError, ValueError) as error:
        raise UserError(str(error)) from None
    if args.aps is not None and args.aps <= 0 or args.agents is not None and args.agents < 1:
        raise UserError("--aps must be > 0 and --agents >= 1")
    if ttft <= 0 or (tpot is not None and tpot <= 0) or duration_s <= 0:
        raise UserError("--ttft-p90, --tpot and --duration must be > 0")
    dataset = _trace(args.trace, args.out / "traces") if args.trace else args.dataset or "64k"
    online = args.aps is not None
    template = RunSpec(
        model=args.model, hardware=args.hardware, p=1, d=1, mode="dualpath", dataset=dataset,
        agents=max(1, round(args.aps * duration_s)) if online else args.agents,
        aps=args.aps, duration_s=duration_s if online else None, overrides=tuple(args.set), seed=args.seed,
        # A run clearly past the TTFT target stops early and counts as a miss (experiments/advise.py).
        early_stop_ttft_s=max(ttft, EARLY_STOP_FLOOR_S) if online else None,
        # ... and every run once its TTFT p90 is certain to miss it (a proof: sim/early_stop.py).
        early_stop_p90_ttft_s=max(ttft, EARLY_STOP_FLOOR_S),
        # Every run records its links, so the chosen run names its binding link itself (no re-run).
        link_summary=not args.no_links,
    )  # fmt: skip
    rng = pd_range(cluster.hardware)
    if rng.is_empty:
        raise UserError(f"the planner's bottleneck-free P/D range is empty on {args.hardware}")
    return problem(template=template, slo=slo(ttft_p90_s=ttft, tpot_p90_s=tpot), pd_range=rng,
                   gpus_per_node=cluster.hardware.gpus_per_node, max_nodes=args.max_nodes,
                   cannot_run=_cannot_run(cluster, template, UserError))  # fmt: skip


def _cannot_run(cluster: Any, template: Any, error: Any) -> Any:
    """Why a split (P, D) cannot run at all, by the closed forms `dualpath simulate` refuses it with: the
    model's weights do not fit a GPU at that expert parallelism, or a DE cannot hold the workload's
    longest trajectory (None: it can run). Loads the run's trajectories once to know the longest."""
    from dualpath.cli.cmd_simulate import _split_workload_sets
    from dualpath.sim.agents import load_trajectories, scale_rounds
    from dualpath.sim.driver import requests_fit_error
    from dualpath.sim.rates import hbm_kv_tokens

    _, scales = _split_workload_sets(list(template.overrides), error)
    try:
        trajectories = scale_rounds(
            load_trajectories(template.dataset, template.agents, template.seed), **scales
        )
    except (ValueError, FileNotFoundError) as exc:
        raise error(str(exc)) from None
    g = cluster.hardware.gpus_per_node

    def why(p: int, d: int) -> str | None:
        try:
            hbm_kv_tokens(cluster, role_gpus=p * g)
            de_tokens = hbm_kv_tokens(cluster, role_gpus=d * g)
        except ValueError as exc:  # the weights alone overflow a GPU's HBM
            return str(exc)
        return requests_fit_error(trajectories, de_tokens, cluster)

    return why


def _trace(name_or_path: str, folder: Path) -> str:
    """A shipped trace or a file: a trajectory file, or a Mooncake trace converted to one agent per session
    (experiments/traces.py)."""
    from dualpath.experiments.traces import as_trajectory_file
    from dualpath.workload.errors import TraceFormatError
    from dualpath.workload.shipped import resolve_trace

    try:
        return str(as_trajectory_file(resolve_trace(name_or_path), folder))
    except (FileNotFoundError, TraceFormatError) as error:
        raise UserError(f"--trace {name_or_path}: {error}") from None


def _check_modes(modes: list[str]) -> None:
    from dualpath.engine.modes import MODES

    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UserError(f"unknown --modes {', '.join(bad) or '(none)'}; choose from {', '.join(MODES)}")
