"""The simulator's prediction of a runtime cluster: the runtime's layout, the calibrated machine, one trace.

Every simulator input comes from the runtime cluster file (P/D, one engine per node, block size, DE KV
capacity, DRAM buffer, emulated SNIC/CNIC rates) and from calibration microbenchmarks (docs/twin.md).
Nothing here is fitted to a validate result. The simulator is given them as values: `SimConfig` with
the calibrated step costs in CPU seconds (`RuntimeStepCosts`) and the host (`sim.host.HostSpec`: cores,
in-situ factors, fixed times), and the load generator's agent starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dualpath.architecture import arch
from dualpath.config.specs import ClusterSpec, HardwareSpec, SchedulerSpec
from dualpath.metrics.summary import summarize_latencies
from dualpath.policy.inputs import PrefillProfile, pairwise_attention_time, policy_inputs
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.sim.agents import Round
from dualpath.sim.cost import CostModel
from dualpath.sim.driver import SimConfig, SimOutcome, Simulation
from dualpath.sim.host import HostSpec
from dualpath.twin.calibration import NO_FACTORS, Calibration, CalibrationOverheads, de_hbm_bytes

# What the runtime's PE measures at start-up for β and the §6.4 predictor (runtime/model_host.py):
# a 256-token prompt alone, and the same 256 tokens over a 768-token cached prefix.
_PROBE_NEW_TOKENS = 256
_PROBE_CACHED_TOKENS = 3 * _PROBE_NEW_TOKENS
# A quarter core: what our processes keep even when other jobs used (nearly) every core.
_MIN_CAPACITY_CORES = 0.25
# The runtime's code paths (HTTP legs, control and chunk CPU) the host charges as they were measured.
_HOST_TERMS = ("http_leg_s", "http_leg_s_per_prompt_token", "http_cpu_s", "http_cpu_s_per_prompt_token",
               "control_cpu_s", "sse_chunk_cpu_s")  # fmt: skip


class RuntimeStepCosts:
    """The calibrated cost model in CPU seconds as the runtime's engine threads spend them: a forward is
    the sum of its items' own forwards (the PE computes item after item, `pe_executor._step`, so each
    reads the weights and pays the call overheads again: the cost model's batched form shares them), plus
    its head, Python work and a control round trip (and in oracle its hit's store read), each piece times
    its group's in-situ factor (twin/calibration_runtime.py)."""

    def __init__(
        self, base: CostModel, o: CalibrationOverheads, factors: Mapping[str, float], cluster: ClusterSpec,
        *, oracle: bool,
    ) -> None:  # fmt: skip
        self._base, self._o = base, o
        self._pe, self._de = factors["pe_engine"], factors["de_engine"]
        self._oracle, self._block_tokens = oracle, cluster.scheduler.block_tokens
        self._read_s_per_token = arch.kv_bytes_per_token(cluster.model) / cluster.hardware.storage_bytes_per_s

    def prefill_step_s(
        self, per_gpu_batches: Sequence[Sequence[tuple[int, int]]], layer_index: int
    ) -> tuple[float, float, list[float]]:
        attention = self._base.prefill_step_s(per_gpu_batches, layer_index)[2]
        items = [self._base.prefill_step_s([[item]], layer_index) for b in per_gpu_batches for item in b]
        forward_s, layer_s = sum(i[0] for i in items), sum(i[1] for i in items)
        own_s = (forward_s + self.forward_fixed_s(per_gpu_batches)) * self._pe
        return own_s + self.oracle_pe_read_s(per_gpu_batches) * self._pe, layer_s * self._pe, attention

    def decode_step_max_s(self, shape: Sequence[tuple[int, int]]) -> float:
        return float(self._base.decode_step_max_s(shape)) * self._de

    def forward_fixed_s(self, per_gpu_batches: Sequence[Sequence[tuple[int, int]]]) -> float:
        """A PE forward's CPU beyond its layers: head, Python work per forward and item, round trip."""
        o = self._o
        items = sum(len(b) for b in per_gpu_batches)
        cached = sum(c for b in per_gpu_batches for c, _ in b)
        python_s = (
            o.prefill_python_s
            + o.prefill_python_s_per_item * items
            + o.prefill_python_s_per_cached_token * cached
        )
        return o.prefill_head_s + python_s + o.control_round_trip_s

    def oracle_pe_read_s(self, per_gpu_batches: Sequence[Sequence[tuple[int, int]]]) -> float:
        """Oracle: the PE's worker reads each first chunk's hit from the store itself before computing
        (runtime/pe_executor.py `_resolve` -> `_read`, `inline_io`): one `store_read_op_s` per Full Block
        + bytes at the FileStore read rate (page-cache warm: CPU on the worker's thread). Items of later
        chunks are counted as first chunks (an over-count)."""
        if not self._oracle:
            return 0.0
        bt = self._block_tokens
        cached = sum(c for batch in per_gpu_batches for c, _ in batch)
        blocks = sum(-(-c // bt) for batch in per_gpu_batches for c, _ in batch if c > 0)
        return blocks * self._o.store_read_op_s + cached * self._read_s_per_token


def twin_simulation(
    config: SimConfig,
    trajectories: Sequence[Sequence[Round]],
    *,
    seed: int,
    overheads: CalibrationOverheads,
    host_cores: float,
    external_cores: float = 0.0,
    probe_cpu_s: float = 0.0,
    cpu_factors: Mapping[str, float] | None = None,
) -> Simulation:
    """`config`'s simulator with engines on the calibrated host (sim/host.py): other jobs' cores are
    capacity we do not get; `cpu_factors` are the in-situ factors (`NO_FACTORS` where not measured)."""
    from dualpath.engine.modes import get_mode
    from dualpath.runtime.loadgen import poisson_starts
    from dualpath.runtime.persist import COMMITS_IN_FLIGHT

    given = cpu_factors or {}
    f = {**NO_FACTORS, **{g: float(v) for g, v in given.items() if g in NO_FACTORS}}
    assert config.cost_model is not None  # the calibrated cost model (`sim_config`)
    o = overheads
    # The cores' speed against the factors' replays: the speed probe's CPU there over here (1: unmeasured);
    # the forward's stall and the trips are waits for the cores (the GIL, wake-ups): they scale with it.
    ref = f["probe_cpu_s"]
    speed = ref / probe_cpu_s if ref > 0.0 and probe_cpu_s > 0.0 else 1.0
    host = HostSpec(
        capacity_cores=max(_MIN_CAPACITY_CORES, host_cores - external_cores),
        cpu_speed=speed,
        background_cores=f["background_cores"],
        pe_stall_s=f["pe_stall_s"] / speed,
        de_efficiency=f["de_efficiency"],
        client_cpu_factor=f["client"],
        # The in-situ wait between a DE's decode runs, where measured, else the idle round trip.
        command_trip_s=float(given.get("decode_restart_s", o.control_round_trip_s)) / speed,
        commit_s=o.store_write_op_s,
        commits_in_flight=COMMITS_IN_FLIGHT,
        **{k: getattr(o, k) for k in _HOST_TERMS},  # the same names in both
    )
    costs = RuntimeStepCosts(config.cost_model, o, f, config.cluster, oracle=get_mode(config.mode).skip_io)
    starts = poisson_starts(len(trajectories), config.aps, np.random.default_rng([seed, 1]))
    config = replace(config, step_costs=costs, host=host, agent_starts_s=tuple(starts))
    return Simulation(config, trajectories, seed=seed)


def sim_hardware(spec: RuntimeClusterSpec, cal: Calibration) -> HardwareSpec:
    """The calibrated node with this cluster's emulated rates, buffer and DE capacity.

    The calibration measured achieved NIC rates at its own cluster's configured rates; a cluster with
    other configured rates gets the same achieved/configured ratio (the limiter's efficiency).
    """
    measured, hw = cal.measurements.get("cluster", {}), cal.hardware

    def achieved(key: str) -> float:  # this cluster's configured rate x the calibrated achieved/configured
        return float(getattr(hw, key) * getattr(spec, key) / float(measured.get(key, getattr(hw, key))))

    return replace(
        hw,
        gpus_per_node=spec.engines_per_node,
        snic_bytes_per_s=achieved("snic_bytes_per_s"),
        cnic_bytes_per_s=achieved("cnic_bytes_per_s"),
        dram_buffer_bytes=float(spec.dram_buffer_bytes),
        gpu=replace(hw.gpu, hbm_bytes=de_hbm_bytes(cal.model, spec.hbm_tokens)),
    )


def sim_cluster(spec: RuntimeClusterSpec, cal: Calibration) -> ClusterSpec:
    return ClusterSpec(
        hardware=sim_hardware(spec, cal),
        model=cal.model,
        num_prefill_nodes=spec.num_prefill_nodes,
        num_decode_nodes=spec.num_decode_nodes,
        scheduler=SchedulerSpec(block_tokens=spec.block_tokens),
        name=f"twin-{spec.name}",
    )


def runtime_predictor_terms(cost: CostModel) -> tuple[float, float]:
    """(prefill tokens/s, attention s per token pair) as the runtime's PE measures them, from the cost model."""
    bare_s = cost.prefill_forward_time_s([[(0, _PROBE_NEW_TOKENS)]])
    over_s = cost.prefill_forward_time_s([[(_PROBE_CACHED_TOKENS, _PROBE_NEW_TOKENS)]])
    pair_s = max(0.0, over_s - bare_s) / (_PROBE_NEW_TOKENS * _PROBE_CACHED_TOKENS)
    return _PROBE_NEW_TOKENS / bare_s, pair_s


def sim_config(
    spec: RuntimeClusterSpec,
    cal: Calibration,
    mode: str,
    *,
    aps: float | None = None,
    scheduler_rates: Mapping[str, float] | None = None,
) -> SimConfig:
    """The simulator set up as the runtime's scheduler sets up its core (runtime/scheduler.py driver_config).

    `scheduler_rates`: the PE's prefill rate and attention cost per token pair as a runtime measured them
    at start-up (its /health; they set β and the §6.4 quota, so its batches); by default the calibrated
    cost model's (`runtime_predictor_terms`).
    """
    from dualpath.runtime.driver import DECODE_RUN_STEPS

    cluster = sim_cluster(spec, cal)
    prefill_tokens_per_s, pair_s = runtime_predictor_terms(cal.cost_model)
    if scheduler_rates:
        prefill_tokens_per_s = float(scheduler_rates.get("prefill_tokens_per_s", prefill_tokens_per_s))
        pair_s = float(scheduler_rates.get("attention_s_per_token_pair", pair_s))
    # As the runtime's driver: its configured SNIC rate and its PE's start-up profile (`policy.inputs`).
    profile = PrefillProfile(
        tokens_per_s=prefill_tokens_per_s, attention_time_s=pairwise_attention_time(pair_s)
    )
    inputs = policy_inputs(cluster.scheduler, read_bytes_per_s=spec.snic_bytes_per_s,
                           kv_bytes_per_token=arch.kv_bytes_per_token(cal.model), prefill=profile)  # fmt: skip
    return SimConfig(
        cluster=cluster,
        mode=mode,
        read_path=spec.read_path or None,
        aps=aps,
        cost_model=cal.cost_model,
        policy=inputs,
        max_decode_run_steps=DECODE_RUN_STEPS,
    )


def predict(
    spec: RuntimeClusterSpec,
    cal: Calibration,
    mode: str,
    trajectories: Sequence[Sequence[Round]],
    *,
    aps: float | None = None,
    seed: int = 0,
    external_cores: float = 0.0,
    probe_cpu_s: float = 0.0,
    cpu_factors: Mapping[str, float] | None = None,
    scheduler_rates: Mapping[str, float] | None = None,
) -> tuple[dict[str, Any], SimOutcome]:
    """Simulate the trace; the result has the runtime summary's keys (`metrics_from_sim`) and
    `cpu_s_by_thread` (the CPU seconds the twin charged each of our threads).

    `external_cores`: cores other jobs used on the host meanwhile (`host_load.HostLoadSampler`); our own
    processes' CPU is predicted from the calibration (`twin_simulation`); `probe_cpu_s`, the host's speed
    probe meanwhile (`host_load`). `cpu_factors`: the
    in-situ factors per thread group (`calibration_runtime`), by default the calibration's for `mode`.
    `scheduler_rates`: the measured run's scheduler constants (`sim_config`).
    """
    if cpu_factors is None:
        cpu_factors = cal.cpu_factors(mode)
    sim = twin_simulation(sim_config(spec, cal, mode, aps=aps, scheduler_rates=scheduler_rates), trajectories, seed=seed,
                         overheads=cal.overheads, host_cores=host_cores(cal),
                         external_cores=external_cores, probe_cpu_s=probe_cpu_s,
                         cpu_factors=cpu_factors)  # fmt: skip
    outcome = sim.run()
    metrics = metrics_from_sim(outcome, spec)
    assert sim.host is not None
    metrics["cpu_s_by_thread"] = dict(sorted(sim.host.cpu.cpu_s_by_thread.items()))
    metrics["engine_work"] = {group: list(counts) for group, counts in sim.host.engine_work.items()}
    if sim.mode.skip_io:
        _oracle_bytes(metrics, outcome, spec, sim)
    return metrics, outcome


def _oracle_bytes(metrics: dict[str, Any], o: SimOutcome, spec: RuntimeClusterSpec, sim: Any) -> None:
    """Oracle moves no bytes in the simulator, but the runtime still reads each hit through the PE's SNIC
    and writes every whole block through the DE's (unpaced): count them the same way."""
    names = [name for name, _ in spec.node_ids()]
    kv = sim.kv_bytes
    bt = spec.block_tokens
    for r in o.requests.values():
        if r.pe_engine < 0 or r.de_engine < 0:
            continue
        pe, de = names[sim.core.node_of_engine(r.pe_engine)], names[sim.core.node_of_engine(r.de_engine)]
        metrics["snic_bytes"][pe]["rx"] += r.hit_tokens * kv
        new_blocks = max(0, (r.prompt_tokens + r.gen_tokens - 1) // bt - r.hit_tokens // bt)
        metrics["snic_bytes"][de]["tx"] += new_blocks * bt * kv
    metrics["read_path_bytes"] = read_path_bytes(metrics["snic_bytes"], spec)


def host_cores(cal: Calibration) -> float:
    """Cores the runtime's engine processes share: the calibrated machine's (meta.cpu_count)."""
    return float(cal.meta.get("cpu_count") or 1)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def metrics_from_sim(o: SimOutcome, spec: RuntimeClusterSpec) -> dict[str, Any]:
    reqs = [r for r in o.requests.values() if not math.isnan(r.first_token_s)]
    ttft = [r.first_token_s - r.arrival_s for r in reqs]
    ttft_s = summarize_latencies(ttft)  # numpy's percentiles, as the runtime summary's
    tpot = [(r.last_token_s - r.first_token_s) / (r.gen_tokens - 1) for r in reqs if r.gen_tokens >= 2]
    generated = sum(r.gen_tokens for r in reqs)
    jct = max((a.end_s for a in o.agents), default=0.0)
    names = [name for name, _ in spec.node_ids()]
    snic = {
        names[i]: {"rx": n.snic_rx.bytes_carried(o.end_s), "tx": n.snic_tx.bytes_carried(o.end_s)}
        for i, n in enumerate(o.topology.nodes)
    }
    return {
        "jct_s": jct,
        "ttft_mean_s": ttft_s["mean"],
        "ttft_p90_s": ttft_s["p90"],
        "tpot_mean_s": _mean(tpot),
        "throughput_tok_s": generated / jct if jct > 0 else 0.0,
        "snic_bytes": snic,
        "read_path_bytes": read_path_bytes(snic, spec),
        "ttft_series": sorted((r.first_token_s, r.first_token_s - r.arrival_s) for r in reqs),
        "milestones_mean_s": {  # the runtime's names (bench summary), mean seconds after arrival
            "pe_assigned": _mean([r.scheduled_s - r.arrival_s for r in reqs]),
            "prefill_start": _mean([r.prefill_start_s - r.arrival_s for r in reqs]),
            "prefill_end": ttft_s["mean"],
            "finished": _mean([r.done_s - r.arrival_s for r in reqs if not math.isnan(r.done_s)]),
        },
    }


def read_path_bytes(snic: dict[str, dict[str, float]], spec: RuntimeClusterSpec) -> dict[str, float]:
    """Bytes read from storage on each path: a PE's SNIC reads PE-path hits, a DE's reads DE-path hits."""
    roles = dict(spec.node_ids())
    out = {"pe_read": 0.0, "de_read": 0.0}
    for node, d in snic.items():
        out["pe_read" if roles.get(node) == "prefill" else "de_read"] += float(d.get("rx", 0.0))
    return out
