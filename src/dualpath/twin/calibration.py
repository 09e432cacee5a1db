"""Calibration presets: the types and their TOML file (docs/twin.md "The preset file"). A leaf of `twin`.

`dualpath calibrate` measures and fits (`calibrate`), the twin's prediction reads (`predict`); both meet
here, so neither imports the other.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dualpath.architecture import arch
from dualpath.config.coerce import ConfigError, build
from dualpath.config.loader import load_model
from dualpath.config.specs import HardwareSpec, ModelSpec
from dualpath.config.toml_write import dumps
from dualpath.config.validate import validate
from dualpath.sim.cost import CostModel
from dualpath.sim.rates import HBM_NON_KV_FRACTION
from dualpath.twin.calibration_fit import FitQuality

CALIBRATION_FORMAT = 1
Tick = Callable[[str], None]  # progress: called once per measured step with its name
# Without an in-situ measurement the twin charges what the code-path measurements say: engines, scheduler
# and client as measured alone, no CPU for the nodes' I/O threads.
NO_FACTORS = {
    "pe_engine": 1.0,
    "de_engine": 1.0,
    "client": 1.0,
    "background_cores": 0.0,
    "pe_stall_s": 0.0,
    "de_efficiency": 1.0,
    # The host's speed probe during the replays the factors came from (`host_load`); 0: not measured.
    "probe_cpu_s": 0.0,
}


def de_hbm_bytes(model: ModelSpec, hbm_tokens: int) -> float:
    """The "HBM" of a runtime DE: `hbm_tokens` of KV beside the weights after the simulator's non-KV share
    (`sim.rates.hbm_kv_tokens` inverts this), so the simulated DE admits what the runtime's does."""
    return (hbm_tokens * arch.kv_bytes_per_token(model) + arch.weight_bytes(model)) / (
        1 - HBM_NON_KV_FRACTION
    )


# A mode without a training run of its own takes the factors of the mode whose runtime path it shares.
NEAREST_MODE = {"layerwise": "basic", "dualpath-rr": "dualpath"}


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message says what is wrong."""


@dataclass(frozen=True, kw_only=True)
class CalibrationOverheads:
    """Fixed times the cost model has no field for; the twin's driver adds them where the runtime pays."""

    snic_transfer_s: float  # per transfer on the emulated SNIC (RateLimiter wake-ups), beside bytes / rate
    cnic_transfer_s: float  # the same on the emulated CNIC
    shm_write_s: float  # SharedMemoryBackend: fixed part of one write + its completion notice
    shm_write_bytes_per_s: float  # its copy rate (unpaced)
    notice_round_trip_s: float  # two data-less notices, there and back (e.g. pull -> hit_layer)
    control_round_trip_s: float  # a control message to the scheduler (ZeroMQ, TCP loopback) and its answer
    store_read_op_s: float  # FileStore: fixed part of one read (open, pread, crc32)
    store_write_op_s: float  # FileStore: fixed part of one atomic put (temp file, fsync, rename)
    store_write_bytes_per_s: float  # FileStore write rate (reads: hardware.storage_bytes_per_s)
    prefill_head_s: float  # embedding + LM head per PE forward (median over prompt lengths)
    # Measured since the runtime's own code paths were timed (calibration_http, calibration_forward);
    # a preset written before has none of them and loads with 0.0 (the twin then leaves them out).
    http_leg_s: float = 0.0  # POST -> first SSE chunk with a no-op backend (both HTTP legs of a TTFT)
    http_leg_s_per_prompt_token: float = 0.0  # its growth with the prompt's length
    http_cpu_s: float = 0.0  # CPU of API server + client for one such request
    http_cpu_s_per_prompt_token: float = 0.0  # its growth with the prompt's length
    sse_chunk_cpu_s: float = 0.0  # CPU of server + client per further streamed chunk
    prefill_python_s: float = 0.0  # PE forward CPU beyond its layers and head, per forward
    prefill_python_s_per_item: float = 0.0  # the same, per request in the forward
    prefill_python_s_per_cached_token: float = 0.0  # the same, per cached row loaded (copies, bytes)
    control_cpu_s: float = 0.0  # CPU of one control message: encode, ZeroMQ send and receive, decode


@dataclass(frozen=True, kw_only=True)
class Calibration:
    hardware: HardwareSpec
    model: ModelSpec
    cost_model: CostModel
    overheads: CalibrationOverheads
    fit_report: dict[str, FitQuality]
    parameters: dict[str, float] = field(default_factory=dict)  # fitted numbers behind the curves
    measurements: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # In-situ CPU factors per mode and thread group (twin/calibration_runtime.py); empty: not measured.
    runtime_cpu: dict[str, dict[str, float]] = field(default_factory=dict)

    def cpu_factors(self, mode: str) -> dict[str, float]:
        """The in-situ factors for `mode` (its nearest trained mode's if it has none; {} if not measured)."""
        return self.runtime_cpu.get(mode) or self.runtime_cpu.get(NEAREST_MODE.get(mode, ""), {})


def calibration_document(calibration: Calibration) -> dict[str, Any]:
    return {
        "meta": {"format": CALIBRATION_FORMAT, **calibration.meta},
        "model": {"preset": calibration.model.name},
        "hardware": asdict(calibration.hardware),
        "cost": calibration.cost_model.to_dict(),
        "overheads": asdict(calibration.overheads),
        "fit": {
            **{name: q.to_dict() for name, q in calibration.fit_report.items()},
            "parameters": dict(calibration.parameters),
        },
        "measurements": calibration.measurements,
        "runtime_cpu": calibration.runtime_cpu,
    }


_COMMENTS = {
    "hardware.pcie_bytes_per_s": "no PCIe on the CPU runtime: the H2D is a memcpy; set far above every link",
    "hardware.dram_bytes_per_s": "measured memcpy, counted half-duplex (read + write bytes)",
    "hardware.snic_bytes_per_s": "achieved by the emulated SNIC (RateLimiter) at the configured rate",
    "hardware.cnic_bytes_per_s": "achieved by the emulated CNIC (RateLimiter) at the configured rate",
    "hardware.storage_bytes_per_s": "measured FileStore read rate (page cache warm)",
    "hardware.dram_buffer_bytes": "from the runtime cluster file",
    "hardware.gpus_per_node": "one engine per node process",
    "hardware.gpu.hbm_bytes": "the DE's KV capacity (hbm_tokens) + weights, over the simulator's KV share",
    "hardware.gpu.hbm_bytes_per_s": "measured weight streaming rate",
}


def write_calibration(calibration: Calibration, path: Path) -> None:
    header = (
        "DualPath calibration preset, written by `dualpath calibrate` (docs/twin.md).\n"
        "Load it with dualpath.twin.load_calibration; every number was measured on [meta].machine."
    )
    text = dumps(calibration_document(calibration), header=header, comments=_COMMENTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration preset back: specs, the fitted cost model, overheads and the fit report."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CalibrationError(f"no calibration file {str(path)!r}") from None
    except tomllib.TOMLDecodeError as error:
        raise CalibrationError(f"{path} is not valid TOML: {error}") from None
    missing = [s for s in ("model", "hardware", "cost", "overheads") if s not in doc]
    if missing:
        raise CalibrationError(f"{path}: missing section(s) {', '.join(missing)}; rerun `dualpath calibrate`")
    try:
        model = load_model(doc["model"]["preset"])
        hardware = build(HardwareSpec, doc["hardware"], path="hardware")
        validate(hardware)
        cost_model = CostModel.from_dict(model, doc["cost"])
        known = {f.name for f in fields(CalibrationOverheads)}
        overheads = CalibrationOverheads(**{k: float(v) for k, v in doc["overheads"].items() if k in known})
    except (ConfigError, KeyError, TypeError, ValueError) as error:
        raise CalibrationError(f"{path}: {error}") from None
    fit = dict(doc.get("fit", {}))
    parameters = {k: float(v) for k, v in fit.pop("parameters", {}).items()}
    return Calibration(
        hardware=hardware,
        model=model,
        cost_model=cost_model,
        overheads=overheads,
        fit_report={name: FitQuality.from_dict(q) for name, q in fit.items()},
        parameters=parameters,
        measurements=doc.get("measurements", {}),
        meta=doc.get("meta", {}),
        runtime_cpu={
            mode: {g: float(v) for g, v in groups.items()}
            for mode, groups in doc.get("runtime_cpu", {}).items()
        },
    )
