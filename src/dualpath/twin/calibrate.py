"""`dualpath calibrate`: measure the runtime's machine, fit the simulator's cost model, write a preset.

The twin's step one: the simulator predicts the runtime only if its coefficients describe the
runtime's machine, so this module times what the node processes run (the tiny model's `prefill_layer`
and `decode_step`, emulated SNIC/CNIC, shared-memory writes with notices, ZeroMQ control messages,
`FileStore` reads and writes) and fits them with the GPU cost model's own forms (`calibration_fit`).
The result is a `calibration.Calibration`, written as one TOML preset (`calibration.write_calibration`).
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dualpath.config.loader import load_model
from dualpath.config.specs import GpuSpec, HardwareSpec, ModelSpec
from dualpath.config.validate import validate
from dualpath.runtime.cluster import RuntimeClusterSpec
from dualpath.sim.cost import CostModel
from dualpath.twin.calibration import NO_FACTORS, Calibration, CalibrationOverheads, Tick, de_hbm_bytes
from dualpath.twin.calibration_fit import (
    DecodePoint,
    LineFit,
    PrefillPoint,
    columns,
    fit_cost_coefficients,
    fit_line,
    points,
)
from dualpath.twin.calibration_io import SizedTimes

# There is no PCIe hop on the CPU runtime: the "H2D" into the DE's KV cache is an in-memory copy that the
# DRAM rate already covers, so PCIe is set far above every other link and never binds.
CPU_PCIE_BYTES_PER_S = 1e15
# Prompt lengths for the HTTP legs: the scaled 64K trace's prompts run from tens to ~2K tokens.
_HTTP_PROMPT_TOKENS = (16, 512, 2048)
# The modes `validate` and `demo` compare; each gets in-situ CPU factors (twin/calibration_runtime.py).
RUNTIME_MODES = ("basic", "dualpath", "oracle")


# ---- measuring ------------------------------------------------------------------------------------


def measure(
    cluster: RuntimeClusterSpec, *, quick: bool, threads: int, tick: Tick, store_dir: Path | None = None
) -> dict[str, Any]:
    """Every raw measurement for `cluster` on this machine, as plain lists (the [measurements] table)."""
    import torch

    from dualpath.runtime.model_host import build_model
    from dualpath.twin import calibration_io as io
    from dualpath.twin import calibration_model as cm
    from dualpath.twin.calibration_forward import measure_forward_python
    from dualpath.twin.calibration_http import measure_http

    grid = cm.QUICK_GRID if quick else cm.FULL_GRID
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = build_model(cluster.model, device=cluster.device, seed=cluster.seed)
        generator = torch.Generator().manual_seed(cluster.seed)
        prefill = cm.measure_prefill_layer(model, grid, generator, tick)
        decode = cm.measure_decode_step(model, grid, generator, tick, block_tokens=cluster.block_tokens)
        head = cm.measure_forward_head(model, grid, generator, tick)
        weight_read = cm.measure_weight_read_bytes_per_s(model, grid.repeats, tick)
        forward_python = measure_forward_python(model, grid.repeats, tick)
    finally:
        torch.set_num_threads(previous_threads)
    row_bytes = model.config.kv_bytes_per_token_per_layer
    layers = model.config.num_layers
    layer_block = cluster.block_tokens * row_bytes
    full_block = layers * layer_block
    request_layer = 1024 * row_bytes  # one layerwise transfer of a 1K-token request
    repeats = 3 if quick else 7
    sizes = (layer_block, full_block, request_layer)
    snic = io.measure_link(cluster.snic_bytes_per_s, sizes, repeats, tick, "snic")
    cnic = io.measure_link(cluster.cnic_bytes_per_s, (*sizes, 4 * request_layer), repeats, tick, "cnic")
    shm, notice_rtt = io.measure_shm_write((*sizes, 4 * request_layer), repeats, tick)
    control_rtt, control_cpu = io.measure_control_round_trip(repeats, tick)
    http = measure_http(_HTTP_PROMPT_TOKENS, 9 if quick else 25, tick, block_tokens=cluster.block_tokens)
    memcpy = io.measure_memcpy_bytes_per_s(64 * 2**20, repeats, tick)
    store = io.measure_file_store(
        num_layers=layers,
        layer_block_bytes=(layer_block, 4 * layer_block, 16 * layer_block),
        repeats=5 if quick else 15,
        tick=tick,
        directory=store_dir,
    )
    return {
        "cluster": {
            "name": cluster.name,
            "model": cluster.model,
            "block_tokens": cluster.block_tokens,
            "engines_per_node": cluster.engines_per_node,
            "dram_buffer_bytes": cluster.dram_buffer_bytes,
            "hbm_tokens": cluster.hbm_tokens,
            "snic_bytes_per_s": cluster.snic_bytes_per_s,  # configured (the emulation's target)
            "cnic_bytes_per_s": cluster.cnic_bytes_per_s,
        },
        "prefill_layer": columns(PrefillPoint, prefill),
        "decode_step": columns(DecodePoint, decode),
        "forward_head": {"new_tokens": [n for n, _ in head], "time_s": [t for _, t in head]},
        "weight_read_bytes_per_s": weight_read,
        "memcpy_bytes_per_s": memcpy,
        "snic": snic.to_dict(),
        "cnic": cnic.to_dict(),
        "shm_write": shm.to_dict(),
        "notice_round_trip_s": notice_rtt,
        "control_round_trip_s": control_rtt,
        "control_cpu_s": control_cpu,
        "http": http,
        "forward_python": forward_python,
        "store_write": store.write.to_dict(),
        "store_read": store.read.to_dict(),
    }


# ---- fitting --------------------------------------------------------------------------------------


def fit_measurements(
    model: ModelSpec, measurements: Mapping[str, Any], *, meta: Mapping[str, Any] | None = None
) -> Calibration:
    """A `Calibration` from raw measurements alone (what `calibrate` writes, or a refit of an old file)."""
    m = measurements
    prefill = points(PrefillPoint, m["prefill_layer"])
    decode = points(DecodePoint, m["decode_step"])
    coefficients, report, parameters = fit_cost_coefficients(
        model, prefill, decode, weight_read_bytes_per_s=float(m["weight_read_bytes_per_s"])
    )
    fits = {name: _line(m[name]) for name in ("snic", "cnic", "shm_write", "store_read", "store_write")}
    for name, line in fits.items():
        report[name] = line.quality
    overheads = CalibrationOverheads(
        snic_transfer_s=fits["snic"].fixed_s,
        cnic_transfer_s=fits["cnic"].fixed_s,
        shm_write_s=fits["shm_write"].fixed_s,
        shm_write_bytes_per_s=fits["shm_write"].rate_per_s,
        notice_round_trip_s=statistics.median(m["notice_round_trip_s"]),
        control_round_trip_s=statistics.median(m["control_round_trip_s"]),
        store_read_op_s=fits["store_read"].fixed_s,
        store_write_op_s=fits["store_write"].fixed_s,
        store_write_bytes_per_s=fits["store_write"].rate_per_s,
        prefill_head_s=statistics.median(m["forward_head"]["time_s"]),
        **_runtime_path_terms(m),
    )
    hardware = _hardware(model, m, coefficients.bf16_flops_per_s, coefficients.linear_flops_per_s,
                         snic=fits["snic"].rate_per_s, cnic=fits["cnic"].rate_per_s,
                         storage=fits["store_read"].rate_per_s)  # fmt: skip
    return Calibration(
        hardware=hardware,
        model=model,
        cost_model=CostModel(model, coefficients),
        overheads=overheads,
        fit_report=report,
        parameters=parameters,
        measurements=dict(measurements),
        meta=dict(meta or {}),
        runtime_cpu=_runtime_cpu_factors(m),
    )


def _runtime_cpu_factors(m: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per mode: the in-situ factors (`calibration_runtime.factors`) from the stored numbers, if any."""
    from dualpath.twin.calibration_runtime import factors, fixed_point_step

    stored = m.get("runtime_cpu", {})
    return {
        mode: factors(d["measured_cpu_s"], d["charged_cpu_s"])
        | fixed_point_step(d["measured_cpu_s"], d.get("twin_engine_s", {}))
        for mode, d in stored.items()
    }


def _runtime_path_terms(m: Mapping[str, Any]) -> dict[str, float]:
    """The runtime's own code paths (HTTP legs, PE forward Python, control CPU), where measured."""
    from dualpath.twin.calibration_forward import forward_python_terms
    from dualpath.twin.calibration_http import http_terms

    terms: dict[str, float] = {}
    if "http" in m:
        t = http_terms(m["http"])
        terms |= {k: t[k] for k in ("http_leg_s", "http_leg_s_per_prompt_token", "http_cpu_s",
                                    "http_cpu_s_per_prompt_token")}  # fmt: skip
        terms["sse_chunk_cpu_s"] = t["sse_chunk_cpu_s"]
    if "forward_python" in m:
        terms |= forward_python_terms(m["forward_python"])
    if "control_cpu_s" in m:
        # One round trip is two messages, both ends in the measuring process.
        terms["control_cpu_s"] = float(m["control_cpu_s"]) / 2
    return terms


def _line(d: Mapping[str, Any]) -> LineFit:
    sized = SizedTimes.from_dict(d)
    return fit_line(sized.sizes_bytes, sized.times_s)


def _hardware(model: ModelSpec, m: Mapping[str, Any], bf16: float, linear: float, *, snic: float,
              cnic: float, storage: float) -> HardwareSpec:  # fmt: skip
    c = m["cluster"]
    gpu = GpuSpec(
        name="cpu-calibrated",
        peak_bf16_flops_per_s=bf16,  # fitted attention rate (the cost model's attention peak)
        peak_fp8_flops_per_s=linear,  # no FP8 on a CPU: the fitted linear rate
        hbm_bytes=de_hbm_bytes(model, int(c["hbm_tokens"])),
        hbm_bytes_per_s=float(m["weight_read_bytes_per_s"]),
    )
    hardware = HardwareSpec(
        name=f"cpu-calibrated-{c['name']}",
        gpu=gpu,
        gpus_per_node=int(c["engines_per_node"]),  # one engine per node process = one "GPU"
        cnic_bytes_per_s=cnic,
        snic_bytes_per_s=snic,
        dram_bytes_per_s=float(m["memcpy_bytes_per_s"]),
        pcie_bytes_per_s=CPU_PCIE_BYTES_PER_S,
        dram_buffer_bytes=float(c["dram_buffer_bytes"]),
        storage_bytes_per_s=storage,
    )
    validate(hardware)
    return hardware


# ---- the whole run --------------------------------------------------------------------------------


def calibrate(cluster: RuntimeClusterSpec, *, quick: bool = False, threads: int = 1,
              tick: Tick | None = None, store_dir: Path | None = None,
              runtime_modes: Sequence[str] = RUNTIME_MODES) -> Calibration:  # fmt: skip
    """Measure and fit. `threads`: torch threads, 1 by default as in a node process (runtime/node.py).
    `runtime_modes`: modes whose in-situ CPU factors are measured on a local cluster (none: skip)."""
    started = time.perf_counter()
    tick = tick or (lambda _: None)
    measurements = measure(cluster, quick=quick, threads=threads, tick=tick, store_dir=store_dir)
    import torch

    meta = {
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or platform.system()}".strip(),
        "cpu_count": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch_threads": threads,
        "quick": quick,
        "cluster": cluster.name,
        "duration_s": time.perf_counter() - started,
    }
    calibration = fit_measurements(load_model(cluster.model), measurements, meta=meta)
    if runtime_modes:  # the twin of this fit replays the training trace; the fit itself stays
        measurements["runtime_cpu"] = measure_in_situ(cluster, calibration, runtime_modes, tick)
        meta["duration_s"] = time.perf_counter() - started
        calibration = replace(calibration, measurements=dict(measurements), meta=dict(meta),
                              runtime_cpu=_runtime_cpu_factors(measurements))  # fmt: skip
    return calibration


def measure_in_situ(
    cluster: RuntimeClusterSpec, calibration: Calibration, modes: Sequence[str], tick: Tick
) -> dict[str, dict[str, dict[str, float]]]:
    """Per mode: the runtime's CPU per thread group on the training replays and what the twin charges
    for them, each pooled over the replays (`calibration_runtime.pooled`); then the twin's engine pieces
    on the same replays with those factors, in fixed-point steps of the DE's efficiency and the PE's stall
    (`calibration_runtime.fixed_point_step`; the last step's twin numbers are stored as `twin_engine_s`)."""
    from dualpath.runtime.cluster import dump_cluster
    from dualpath.twin import calibration_runtime as cr

    measured = cr.measure_runtime_cpu(dump_cluster(cluster), modes, tick)
    out = {}
    for mode, replays in measured.items():
        m = cr.pooled(replays)
        charged = cr.pooled([cr.twin_cpu_s(cluster, calibration, mode, r) for r in replays])
        f, twin = cr.factors(m, charged), {}
        for _ in range(cr.FIXED_POINT_STEPS):  # the last run is stored; loading steps once more
            f |= cr.fixed_point_step(m, twin)
            twin = cr.pooled([cr.twin_engine_work(cluster, calibration, mode, r, f) for r in replays])
            twin |= {key: f.get(key, NO_FACTORS[key]) for key in cr.FIXED_POINT_KEYS}  # what it ran with
        out[mode] = {"measured_cpu_s": m, "charged_cpu_s": charged, "twin_engine_s": twin}
    return out


def num_steps(quick: bool, runtime_modes: int = len(RUNTIME_MODES)) -> int:
    """Progress-bar total: one tick per measured shape or link, and per in-situ mode."""
    from dualpath.twin.calibration_forward import CACHED_TOKENS, ITEM_COUNTS
    from dualpath.twin.calibration_model import FULL_GRID, QUICK_GRID

    forward_python = 2 * len(ITEM_COUNTS) * len(CACHED_TOKENS)  # layerwise and whole-KV forwards
    http = len(_HTTP_PROMPT_TOKENS) + 1  # + the streamed chunks
    return (QUICK_GRID if quick else FULL_GRID).num_points() + 20 + forward_python + http + runtime_modes
