"""`dualpath simulate`: one discrete-event run of a PD cluster (docs/simulator.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help="simulate a PD-disaggregated cluster serving agentic trajectories"
    )
    p.add_argument("--hardware", default="hopper-8x400g", help="hardware preset or TOML file")
    p.add_argument("--model", default="deepseek-v3.2", help="model preset or TOML file")
    p.add_argument("--p", type=int, default=2, help="prefill nodes")
    p.add_argument("--d", type=int, default=4, help="decode nodes")
    p.add_argument("--dataset", default="64k", help="32k | 48k | 64k | FILE")
    p.add_argument("--agents", type=int, default=64, help="number of agents (trajectories)")
    p.add_argument("--aps", type=float, default=None, help="online: Poisson agent arrivals per second")
    p.add_argument("--duration", type=float, default=None, help="online: stop after this many seconds")
    p.add_argument("--mode", default="dualpath", help="basic | layerwise | dualpath-rr | dualpath | oracle")
    p.add_argument(
        "--read-path", default=None, help="pe-read | de-read | shorter-queue | split | alternating"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a cluster field")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--early-stop-ttft-s",
        type=float,
        default=None,
        metavar="S",
        help="online: stop once the run is clearly past this TTFT SLO (docs/simulator.md); off by default",
    )
    p.add_argument(
        "--early-stop-factor",
        type=float,
        default=2.0,
        metavar="F",
        help="early stop: the recent mean TTFT must exceed F x the SLO (default 2)",
    )
    p.add_argument(
        "--early-stop-p90-ttft-s",
        type=float,
        default=None,
        metavar="S",
        help="stop as soon as the run's TTFT p90 is certain to exceed S, whatever the rest of the run does "
        "(a proof, online or offline; docs/simulator.md); off by default",
    )
    p.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="NODE@TIME[+DOWN]",
        help="node NODE (p0, d1, ...) dies at TIME (e.g. d0@300s), for good or for DOWN (e.g. +60s); the "
        "core re-plans its requests; the run is repeated without failures to report the JCT cost",
    )
    p.add_argument(
        "--link-summary",
        action="store_true",
        help="record every link and add `link_utilisation` to the result: per link its mean utilisation and "
        "the share of the run at >= 95%% of capacity (what `advise` ranks; `-o` writes it too)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "-o", "--out", type=Path, default=None, help="write records, link CSV, config and plots here"
    )
    p.set_defaults(func=run, exit_without_teardown=True)  # cli/main.py `run`
    return p


def run(args: argparse.Namespace) -> int:
    from dualpath.cli.main import UserError
    from dualpath.config.coerce import ConfigError
    from dualpath.config.loader import load_cluster, spec_to_dict
    from dualpath.engine.modes import MODES
    from dualpath.native import compiled_modules
    from dualpath.policy.read_path import READ_PATH_POLICIES
    from dualpath.sim.agents import load_trajectories, scale_rounds
    from dualpath.sim.driver import SimConfig, Simulation
    from dualpath.sim.summary import summarise, write_outputs

    if args.mode not in MODES:
        raise UserError(f"unknown --mode {args.mode!r}; choose one of {', '.join(MODES)}")
    if args.read_path and args.read_path not in READ_PATH_POLICIES:
        raise UserError(
            f"unknown --read-path {args.read_path!r}; choose one of {', '.join(READ_PATH_POLICIES)}"
        )
    if args.agents < 1 or args.p < 1 or args.d < 1:
        raise UserError("--agents, --p and --d must be >= 1")
    if (args.aps is None) != (args.duration is None) and args.aps is not None and args.aps <= 0:
        raise UserError("--aps must be > 0")
    early_stop = _early_stop(args, UserError)
    if args.early_stop_p90_ttft_s is not None and args.early_stop_p90_ttft_s <= 0:
        raise UserError("--early-stop-p90-ttft-s must be > 0")
    cluster_sets, scales = _split_workload_sets(args.set, UserError)
    try:
        cluster = load_cluster(hardware=args.hardware, model=args.model, num_prefill_nodes=args.p,
                               num_decode_nodes=args.d, overrides=cluster_sets)  # fmt: skip
        trajectories = scale_rounds(load_trajectories(args.dataset, args.agents, args.seed), **scales)
    except (ConfigError, ValueError, FileNotFoundError) as error:
        raise UserError(str(error)) from None
    failures = tuple(parse_failure(item, args.p, args.d, UserError) for item in args.fail)
    config = SimConfig(cluster=cluster, mode=args.mode, read_path=args.read_path, aps=args.aps,
                       duration_s=args.duration, record_links=args.out is not None,
                       link_summary=args.link_summary,
                       early_stop=early_stop, stop_p90_ttft_s=args.early_stop_p90_ttft_s,
                       failures=failures)  # fmt: skip
    started = time.perf_counter()
    try:
        sim = Simulation(config, trajectories, seed=args.seed)
    except ValueError as error:
        raise UserError(str(error)) from None
    outcome = sim.run(progress=None if args.quiet else _progress_bar(sim))
    summary = summarise(outcome, offline=args.aps is None, wall_s=time.perf_counter() - started)
    # Which build ran (native.py): the native one and the pure-Python one give the same results.
    summary.update(mode=args.mode, read_path=args.read_path or MODES[args.mode].read_path,
                   compiled=bool(compiled_modules()))  # fmt: skip
    if failures:  # the same run without them: the failure's cost
        from dataclasses import replace

        calm = Simulation(
            replace(config, failures=(), record_links=False), trajectories, seed=args.seed
        ).run()
        calm_jct = summarise(calm, offline=args.aps is None, wall_s=0.0)["jct_s"]
        summary["failures"] = [{"at_s": t, "node": _node_name(n, args.p), "replanned": k}
                               for t, n, k in sim.failure_log]  # fmt: skip
        summary["jct_without_failures_s"] = calm_jct
        summary["failure_jct_cost_s"] = None if calm_jct is None else summary["jct_s"] - calm_jct
    if args.out is not None:
        resolved = {"cluster": spec_to_dict(cluster), "args": {k: v for k, v in vars(args).items() if k != "func"},
                    "alpha_tokens": sim.rates.alpha_tokens, "beta_tokens": sim.rates.beta_tokens}  # fmt: skip
        write_outputs(outcome, summary, resolved, args.out)
    if args.json:
        print(json.dumps(summary, sort_keys=True, default=str))
    else:
        _table(summary)
    return 0


def parse_failure(item: str, p: int, d: int, error: Any) -> tuple[int, float, float | None]:
    """`NODE@TIME[+DOWN]` (`d0@300s`, `p1@120+60s`) as (core node id, time s, seconds down or None)."""
    from dualpath.units import parse_duration

    name, _, when = item.partition("@")
    at, _, down = when.partition("+")
    role, index = name[:1], name[1:]
    count = {"p": p, "d": d}.get(role)
    if count is None or not index.isdigit() or int(index) >= count or not at:
        raise error(f"--fail {item!r}: want NODE@TIME[+DOWN] with NODE one of p0..p{p - 1}, d0..d{d - 1}")
    try:
        at_s = parse_duration(at)
        down_s = parse_duration(down) if down else None
    except ValueError as exc:
        raise error(f"--fail {item!r}: {exc}") from None
    return (int(index) if role == "p" else p + int(index)), at_s, down_s


def _node_name(node: int, p: int) -> str:
    return f"p{node}" if node < p else f"d{node - p}"


def _early_stop(args: argparse.Namespace, error: Any) -> Any:
    """The `SimConfig.early_stop` rule of `--early-stop-ttft-s` / `--early-stop-factor` (None: off)."""
    from dualpath.sim.early_stop import EarlyStop

    if args.early_stop_ttft_s is None:
        return None
    try:
        return EarlyStop(ttft_slo_s=args.early_stop_ttft_s, factor=args.early_stop_factor)
    except ValueError as exc:
        raise error(f"--early-stop-ttft-s must be > 0 and --early-stop-factor >= 1 ({exc})") from None


WORKLOAD_SETS = ("append_scale", "gen_scale")  # paper Fig. 9: appends / generations scaled by X


def _split_workload_sets(items: list[str], error: Any) -> tuple[list[str], dict[str, float]]:
    """`--set workload.append_scale=X` / `workload.gen_scale=X` scale the replayed rounds; the rest
    are cluster fields."""
    cluster, scales = [], {}
    for item in items:
        key, _, value = item.partition("=")
        if not key.startswith("workload."):
            cluster.append(item)
            continue
        name = key.removeprefix("workload.")
        if name not in WORKLOAD_SETS:
            raise error(
                f"unknown --set {key!r}; workload keys: {', '.join('workload.' + k for k in WORKLOAD_SETS)}"
            )
        try:
            scales[name] = float(value)
        except ValueError:
            raise error(f"--set {key}: {value!r} is not a number") from None
        if scales[name] <= 0:
            raise error(f"--set {key} must be > 0")
    return cluster, scales


def _progress_bar(sim: Any) -> Any:
    from tqdm import tqdm

    bar = tqdm(desc="simulate", unit=" sim-s", file=sys.stderr, bar_format="{desc}: {n:.0f} sim-s {postfix}")

    def update(kernel: Any) -> None:
        bar.n = kernel.now_s
        bar.set_postfix_str(f"{kernel.events_processed} events", refresh=True)

    return update


def _table(s: dict[str, Any]) -> None:
    def f(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    print(f"mode {s['mode']} (read path {s['read_path']})")
    print(f"  JCT           {f(s['jct_s'])} s   ({s['agents_finished']} agents, {s['requests']} requests)")
    for key in ("ttft_s", "ttst_s", "tpot_s"):
        st = s[key]
        print(f"  {key:<13} mean {f(st['mean'])}  p50 {f(st['p50'])}  p90 {f(st['p90'])}  p99 {f(st['p99'])}")
    print(f"  SLO attainment {f(s['slo_attainment'])}   SNIC max/avg {f(s['snic_max_over_avg'])}")
    for failure in s.get("failures", []):
        print(
            f"  failure       {failure['node']} at {f(failure['at_s'])} s, {failure['replanned']} requests re-planned"
        )
    if "failures" in s:
        print(f"  failure cost  JCT {f(s['jct_s'])} s vs {f(s['jct_without_failures_s'])} s without: "
              f"+{f(s['failure_jct_cost_s'])} s")  # fmt: skip
    build = "native build" if s["compiled"] else "pure Python"
    print(f"  simulated {f(s['sim_end_s'])} s in {f(s['sim_wall_s'])} s wall ({build}), {s['events']} events")
