"""In situ: the CPU the runtime's threads spend on a training trace, against what the twin charges for it.

Each piece timed alone on an idle core costs more inside a running cluster. So `calibrate` replays a
*training* trace (the validate trace's profile and concurrency, other seeds `TRAINING_SEEDS`, only
`TRAINING_ROUNDS` rounds) on a fresh local cluster per mode, reads every thread's CPU from /proc before
and after, grouped by what the twin models (`GROUPS`: an engine thread by its OS name, a node's other
threads as its I/O, the scheduler process, the client), and the DEs' decode-restart counters from
/metrics. The twin then runs the same trace (`twin_cpu_s`): per-piece groups get measured ÷ charged as
a factor, the always-busy threads become background cores, the engines' wall ÷ CPU an efficiency
(docs/twin.md "In-situ CPU factors").
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from dualpath.runtime.os_thread import ENGINE_THREAD_NAMES
from dualpath.runtime.prom import parse_decode_restarts, parse_engine_work
from dualpath.twin.calibration import NO_FACTORS, Tick
from dualpath.twin.host_load import HostLoadSampler, clock_ticks_per_s, descendants, parse_stat

_REPORT_WAIT_S = 0.15  # three node report intervals (runtime/node.py: 50 ms)
# Never a validate default. Five replays per mode, pooled (sums of CPU, charged CPU and wall): one replay
# of 16 agents x 5 rounds lasts 2-11 s, and its per-group CPU moved by up to ±20 % (docs/twin.md).
TRAINING_SEEDS = (1_000_003, 1_000_037, 1_000_039, 1_000_081, 1_000_099)
TRAINING_AGENTS = 16  # the validate default's concurrency: the same contention
TRAINING_ROUNDS = 5
GROUPS = ("pe_engine", "pe_io", "de_engine", "de_io", "serve", "client")
# A DE decode run's efficiency: the share of a busy run's wall time its thread runs, beyond what the
# cores' sharing explains (`factors`). Floor: a measurement gone wrong must not stall the twin.
MIN_EFFICIENCY = 0.25
PIECE_KEYS = {"de_engine": "de_efficiency", "pe_engine": "pe_stall_s"}  # fitted per engine, beside its factor
FIXED_POINT_KEYS = ("pe_engine", "de_engine", *PIECE_KEYS.values())  # what a twin replay ran with
# The efficiency and the PE's stall change the twin's contention, hence its own pieces' wall: a few
# fixed-point steps (`calibrate.measure_in_situ`).
FIXED_POINT_STEPS = 8
# Work per piece the twin charges (a forward, a decode step, a request's client side): a factor on it.
PER_PIECE = ("pe_engine", "de_engine", "client")
# Threads that work all the time (reports every 20 ms, polls, copies beside the link pacing), and the
# scheduler beyond its charged messages: cores in the background, their CPU per second of the replay.
IO_GROUPS = ("pe_io", "de_io")
RATE_KEYS = ("prefill_tokens_per_s", "attention_s_per_token_pair")
MEAN_KEYS = (*RATE_KEYS, "external_cores", "probe_cpu_s")  # a replay's conditions: pooled as their mean


def _thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Per thread of process `pid`: (OS thread name, utime + stime ticks)."""
    out = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out[int(task.name)] = parse_stat((task / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return out


def _role(pid: int, root: int) -> str | None:
    """client (the root), serve, pe or de (a node process, by its --name), else None."""
    if pid == root:
        return "client"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if b"dualpath.runtime.node_main" in argv and b"--name" in argv:
        name = argv[argv.index(b"--name") + 1].decode()
        return "pe" if name.startswith("p") else "de"
    return "serve" if b"serve" in argv else None


def snapshot(root: int) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (group, ticks) for every thread of `root` and its descendants that has a group."""
    out = {}
    for pid in [root, *descendants(root)]:
        role = _role(pid, root)
        if role is None:
            continue
        for tid, (name, ticks) in _thread_ticks(pid).items():
            if role in ("pe", "de"):
                group = f"{role}_engine" if name in ENGINE_THREAD_NAMES else f"{role}_io"
            else:
                group = role
            out[(pid, tid)] = (group, ticks)
    return out


def cpu_by_group(
    before: Mapping[tuple[int, int], tuple[str, int]], after: Mapping[tuple[int, int], tuple[str, int]]
) -> dict[str, float]:
    """CPU seconds per group between two snapshots (a thread born meanwhile counts from zero)."""
    out = dict.fromkeys(GROUPS, 0.0)
    hz = clock_ticks_per_s()
    for key, (group, ticks) in after.items():
        out[group] += max(0, ticks - before.get(key, (group, 0))[1]) / hz
    return out


def training_options(seed: int) -> Any:
    from dualpath.runtime.bench import BenchOptions

    return BenchOptions(dataset="64k", agents=TRAINING_AGENTS, max_rounds=TRAINING_ROUNDS, seed=seed)


def measure_runtime_cpu(
    config_toml: str, modes: Sequence[str], tick: Tick, seeds: Sequence[int] = TRAINING_SEEDS
) -> dict[str, list[dict[str, float]]]:
    """Per mode, per training seed: CPU seconds per group over a replay on a fresh cluster."""
    from dualpath.runtime.bench import make_plans
    from dualpath.runtime.launcher import ServeProcess

    with tempfile.TemporaryDirectory(prefix="dualpath-calibration-") as folder:
        config = Path(folder) / "cluster.toml"
        config.write_text(config_toml)
        out: dict[str, list[dict[str, float]]] = {}
        for mode in modes:
            for seed in seeds:
                tick(f"runtime {mode} (training seed {seed})")
                store = Path(folder) / f"store-{mode}-{seed}"
                store.mkdir()
                with ServeProcess(str(config), mode=mode, store_dir=store) as server:
                    out.setdefault(mode, []).append(
                        _replay(server.url, seed, make_plans(training_options(seed)))
                    )
    return out


def _replay(url: str, seed: int, plans: Any) -> dict[str, float]:
    """One training replay: CPU per group, wall, decode restarts, scheduler rates, other jobs' cores."""
    from dualpath.runtime.loadgen import run_bench

    health = httpx.get(f"{url}/health", timeout=10).json()
    before = snapshot(os.getpid())
    with HostLoadSampler(os.getpid()) as host:
        result = asyncio.run(run_bench(url, plans, vocab_size=256, seed=seed, progress=False))
    out = cpu_by_group(before, snapshot(os.getpid()))
    out["wall_s"], out["seed"], out["external_cores"] = result.wall_s, float(seed), host.cores() or 0.0
    out["probe_cpu_s"] = host.probe_cpu_s() or 0.0
    time.sleep(_REPORT_WAIT_S)  # the DEs' last reports reach /metrics
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    out["decode_restarts"], out["decode_restart_s"] = parse_decode_restarts(metrics)
    for node, (_, wall_s, cpu_s) in parse_engine_work(metrics).items():
        group = "pe_engine" if node.startswith("p") else "de_engine"  # node ids p0, d0, d1 (cluster.node_ids)
        out[f"{group}_wall_s"] = out.get(f"{group}_wall_s", 0.0) + wall_s
        out[f"{group}_busy_cpu_s"] = out.get(f"{group}_busy_cpu_s", 0.0) + cpu_s
    for key in RATE_KEYS:  # the run's scheduler constants, for the twin's replay of it
        out[key] = float(health.get(key, 0.0))
    return out


def pooled(replays: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Replays summed (CPU per group, wall, restarts and their total wait); `MEAN_KEYS` averaged."""
    out = {
        k: sum(float(r.get(k, 0.0)) for r in replays)
        for k in replays[0]
        if k not in MEAN_KEYS and k != "seed"
    }
    for key in MEAN_KEYS:
        if key in replays[0]:
            out[key] = sum(float(r.get(key, 0.0)) for r in replays) / len(replays)
    out["replays"] = float(len(replays))
    return out


def _twin_on_replay(
    spec: Any, calibration: Any, mode: str, measured: Mapping[str, float], cpu_factors: Mapping[str, float]
) -> dict[str, Any]:
    """The twin's metrics for one training replay: its seed's trace, that run's other jobs' cores, speed
    probe and scheduler constants, `cpu_factors`."""
    from dualpath.twin.predict import predict
    from dualpath.twin.validate import trace_rounds

    rates = {k: measured[k] for k in RATE_KEYS if measured.get(k, 0.0) > 0.0}
    seed = int(measured["seed"])
    metrics, _ = predict(spec, calibration, mode, trace_rounds(training_options(seed)), seed=seed,
                         cpu_factors=cpu_factors, scheduler_rates=rates,
                         external_cores=float(measured.get("external_cores", 0.0)),
                         probe_cpu_s=float(measured.get("probe_cpu_s", 0.0)))  # fmt: skip
    return metrics


def twin_cpu_s(spec: Any, calibration: Any, mode: str, measured: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds per group the twin charges for one training replay (no factors)."""
    by_thread = _twin_on_replay(spec, calibration, mode, measured, {})["cpu_s_by_thread"]
    return {
        "pe_engine": sum(v for k, v in by_thread.items() if k.startswith("pe")),
        "de_engine": sum(v for k, v in by_thread.items() if k.startswith("de")),
        "serve": by_thread.get("serve", 0.0),
        "client": by_thread.get("client", 0.0),
    }


def twin_engine_work(
    spec: Any, calibration: Any, mode: str, measured: Mapping[str, float], cpu_factors: Mapping[str, float]
) -> dict[str, float]:
    """The twin's engine pieces on one training replay with `cpu_factors` (the factors, the background,
    the DE's efficiency and the PE's stall so far): per engine group its pieces, their wall and CPU
    seconds, as the runtime's EngineWork counts them."""
    metrics = _twin_on_replay(spec, calibration, mode, measured, cpu_factors)
    out = {}
    for group, (pieces, wall_s, cpu_s) in metrics["engine_work"].items():
        out[f"{group}_pieces"], out[f"{group}_wall_s"], out[f"{group}_busy_cpu_s"] = pieces, wall_s, cpu_s
    return out


def fixed_point_step(measured: Mapping[str, float], twin: Mapping[str, float]) -> dict[str, float]:
    """One fixed-point step, from the twin's engine pieces on the training replays (`twin`, with what it
    ran with: `twin[key]`) against the runtime's. Those also lose what the twin does not model: the GIL
    held by the process's other threads, wake-ups on busy cores. Measured per piece (docs/twin.md "Engine
    pieces"), a decode run's wall ÷ CPU is about the same for short and long runs, and a forward's wall
    beyond its CPU is about the same for a 10 ms forward and a 0.7 s one. So:

    - `de_efficiency`, the weight the twin's host (`sim.host`) gives a decode run on the cores (the wall
      it loses goes to the other threads): times (twin wall ÷ CPU) ÷ (runtime's), in [MIN_EFFICIENCY, 1];
    - `pe_stall_s`, a fixed wait after each forward's CPU: plus the PE wall the twin lacks per forward;
    - the per-piece factors: times the runtime's CPU in the pieces ÷ the twin's (its batching moves).
    """
    out = {}
    m_wall, m_cpu = measured.get("de_engine_wall_s", 0.0), measured.get("de_engine_busy_cpu_s", 0.0)
    t_wall, t_cpu = twin.get("de_engine_wall_s", 0.0), twin.get("de_engine_busy_cpu_s", 0.0)
    if min(m_wall, m_cpu, t_wall, t_cpu) > 0.0:
        step = (t_wall / t_cpu) / (m_wall / m_cpu)
        out["de_efficiency"] = max(MIN_EFFICIENCY, min(1.0, twin.get("de_efficiency", 1.0) * step))
    for group in ("pe_engine", "de_engine"):
        m_cpu, t_cpu = measured.get(f"{group}_busy_cpu_s", 0.0), twin.get(f"{group}_busy_cpu_s", 0.0)
        if group in twin and min(m_cpu, t_cpu) > 0.0:
            out[group] = twin[group] * m_cpu / t_cpu
    m_wall, t_wall = measured.get("pe_engine_wall_s", 0.0), twin.get("pe_engine_wall_s", 0.0)
    if min(m_wall, t_wall, twin.get("pe_engine_pieces", 0.0)) > 0.0:
        lacking_s = (m_wall - t_wall) / twin["pe_engine_pieces"]
        out["pe_stall_s"] = max(0.0, twin.get("pe_stall_s", 0.0) + lacking_s)
    return out


def factors(measured: Mapping[str, float], charged: Mapping[str, float]) -> dict[str, float]:
    """What the twin takes from a training replay:

    - per piece (`PER_PIECE`): measured ÷ charged CPU, a factor on each piece the twin charges; for an
      engine, the CPU inside its pieces where the runtime counted it (`os_thread.EngineWork`: a forward,
      a decode run), its thread's whole CPU otherwise;
    - `background_cores`: the I/O threads' CPU, the engine threads' CPU outside their pieces (taking a
      message, a release) and the scheduler's beyond its charged messages, per second of the replay
      (they work all the time: reports, polls, copies beside the links);
    - `decode_restart_s`: the mean time a DE waited between runs of a continuing batch (where measured);
    - `probe_cpu_s`: the host's speed probe over the replays (`host_load`), the speed the factors hold.
    """
    piece_cpu_s = {g: measured.get(f"{g}_busy_cpu_s", 0.0) or measured[g] for g in PER_PIECE}
    out = {
        g: (piece_cpu_s[g] / charged[g] if charged.get(g, 0.0) > 0.0 else NO_FACTORS[g]) for g in PER_PIECE
    }
    wall_s = measured.get("wall_s", 0.0)
    outside_pieces_s = sum(max(0.0, measured[g] - piece_cpu_s[g]) for g in PER_PIECE)
    extra_cpu_s = (
        sum(measured[g] for g in IO_GROUPS)
        + outside_pieces_s
        + max(0.0, measured["serve"] - charged.get("serve", 0.0))
    )
    out["background_cores"] = extra_cpu_s / wall_s if wall_s > 0.0 else 0.0
    out["probe_cpu_s"] = float(measured.get("probe_cpu_s", 0.0))
    if measured.get("decode_restarts", 0.0) > 0.0:
        out["decode_restart_s"] = measured["decode_restart_s"] / measured["decode_restarts"]
    return out
