"""The simulator's prediction of a runtime cluster: the runtime's layout, the calibrated machine, one trace.

Every simulator input comes from the runtime cluster file (P/D, one engine per node, block size, DE KV
capacity, DRAM buffer, emulated SNIC/CNIC rates) and from calibration microbenchmarks (docs/twin.md).
Nothing here is fitted to a validate result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dualpath.config.specs import ClusterSpec, HardwareSpec, SchedulerSpec
from dualpath.model import arch
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.sim.agents import Round
from dualpath.sim.cost import CostModel
from dualpath.sim.driver import SimConfig, SimOutcome
from dualpath.sim.rates import HBM_NON_KV_FRACTION, CoreRates
from dualpath.twin.calibration import Calibration

# What the runtime's PE measures at start-up for β and the §6.4 predictor (runtime/model_host.py):
# a 256-token prompt alone, and the same 256 tokens over a 768-token cached prefix.
_PROBE_NEW_TOKENS = 256
_PROBE_CACHED_TOKENS = 3 * _PROBE_NEW_TOKENS


def sim_hardware(spec: RuntimeClusterSpec, cal: Calibration) -> HardwareSpec:
    """The calibrated node with this cluster's emulated rates, buffer and DE capacity.

    The calibration measured achieved NIC rates at its own cluster's configured rates; a cluster with
    other configured rates gets the same achieved/configured ratio (the limiter's efficiency).
    """
    measured = cal.measurements.get("cluster", {})
    hw = cal.hardware
    snic = (
        hw.snic_bytes_per_s
        * spec.snic_bytes_per_s
        / float(measured.get("snic_bytes_per_s", hw.snic_bytes_per_s))
    )
    cnic = (
        hw.cnic_bytes_per_s
        * spec.cnic_bytes_per_s
        / float(measured.get("cnic_bytes_per_s", hw.cnic_bytes_per_s))
    )
    # The DE "HBM" holds hbm_tokens of KV beside the weights after the simulator's non-KV share.
    hbm = (spec.hbm_tokens * arch.kv_bytes_per_token(cal.model) + arch.weight_bytes(cal.model)) / (
        1 - HBM_NON_KV_FRACTION
    )
    return replace(
        hw,
        gpus_per_node=spec.engines_per_node,
        snic_bytes_per_s=snic,
        cnic_bytes_per_s=cnic,
        dram_buffer_bytes=float(spec.dram_buffer_bytes),
        gpu=replace(hw.gpu, hbm_bytes=hbm),
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
    from dualpath.runtime.driver import linear_attention_predictor

    cluster = sim_cluster(spec, cal)
    prefill_tokens_per_s, pair_s = runtime_predictor_terms(cal.cost_model)
    if scheduler_rates:
        prefill_tokens_per_s = float(scheduler_rates.get("prefill_tokens_per_s", prefill_tokens_per_s))
        pair_s = float(scheduler_rates.get("attention_s_per_token_pair", pair_s))
    s = cluster.scheduler
    # The runtime's driver: α from the configured SNIC rate, β from the PE's measured prefill rate (A.4).
    read_tokens_per_s = spec.snic_bytes_per_s / arch.kv_bytes_per_token(cal.model)
    rates = CoreRates(
        read_tokens_per_s=read_tokens_per_s,
        alpha_tokens=s.alpha_read_s * read_tokens_per_s,
        beta_tokens=s.beta_compute_s * prefill_tokens_per_s,
    )
    predictor = linear_attention_predictor(
        prefill_tokens_per_s=prefill_tokens_per_s, attention_s_per_token_pair=pair_s
    )
    return SimConfig(
        cluster=cluster,
        mode=mode,
        read_path=spec.read_path or None,
        aps=aps,
        cost_model=cal.cost_model,
        core_rates=rates,
        attention_time_s=predictor,
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
    cpu_factors: Mapping[str, float] | None = None,
    scheduler_rates: Mapping[str, float] | None = None,
) -> tuple[dict[str, Any], SimOutcome]:
    """Simulate the trace; the result has the runtime summary's keys (`metrics_from_sim`) and
    `cpu_s_by_thread` (the CPU seconds the twin charged each of our threads).

    `external_cores`: cores other jobs used on the host meanwhile (`host_load.HostLoadSampler`); our own
    processes' CPU is predicted from the calibration (`physics.TwinSimulation`). `cpu_factors`: the
    in-situ factors per thread group (`calibration_runtime`), by default the calibration's for `mode`.
    `scheduler_rates`: the measured run's scheduler constants (`sim_config`).
    """
    from dualpath.twin.physics import TwinSimulation

    if cpu_factors is None:
        cpu_factors = cal.cpu_factors(mode)
    sim = TwinSimulation(sim_config(spec, cal, mode, aps=aps, scheduler_rates=scheduler_rates), trajectories, seed=seed,
                         overheads=cal.overheads, host_cores=host_cores(cal),
                         external_cores=external_cores, cpu_factors=cpu_factors)  # fmt: skip
    outcome = sim.run()
    metrics = metrics_from_sim(outcome, spec)
    metrics["cpu_s_by_thread"] = dict(sorted(sim.host_cpu.cpu_s_by_thread.items()))
    metrics["engine_work"] = {group: list(counts) for group, counts in sim.engine_work.items()}
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


def _p90(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    # Linear interpolation, as numpy.percentile's default (the runtime summary's percentiles).
    pos = 0.9 * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def metrics_from_sim(o: SimOutcome, spec: RuntimeClusterSpec) -> dict[str, Any]:
    reqs = [r for r in o.requests.values() if not math.isnan(r.first_token_s)]
    ttft = [r.first_token_s - r.arrival_s for r in reqs]
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
        "ttft_mean_s": _mean(ttft),
        "ttft_p90_s": _p90(ttft),
        "tpot_mean_s": _mean(tpot),
        "throughput_tok_s": generated / jct if jct > 0 else 0.0,
        "snic_bytes": snic,
        "read_path_bytes": read_path_bytes(snic, spec),
        "ttft_series": sorted((r.first_token_s, r.first_token_s - r.arrival_s) for r in reqs),
        "milestones_mean_s": {  # the runtime's names (bench summary), mean seconds after arrival
            "pe_assigned": _mean([r.scheduled_s - r.arrival_s for r in reqs]),
            "prefill_start": _mean([r.prefill_start_s - r.arrival_s for r in reqs]),
            "prefill_end": _mean(ttft),
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
