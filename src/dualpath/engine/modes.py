"""Serving modes, the same names in the simulator and the runtime (paper §7.1 baselines)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Mode:
    name: str
    layerwise: bool  # load Layer Blocks overlapped with compute (§4.1) vs whole KV into HBM first
    scheduling: str  # "dualpath" (Alg. 1 + two-phase DE) or "round-robin"
    read_path: str  # default read-path policy (overridable by --read-path)
    quota_batching: bool  # §6.4 compute quota; otherwise a new-token budget
    skip_io: bool = False  # oracle: every storage read, H2D/D2H and PD KV transfer takes no time


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        # The unmodified engine: PE-only reads, no layerwise prefill, load-agnostic scheduling.
        Mode(
            name="basic", layerwise=False, scheduling="round-robin", read_path="pe-read", quota_batching=False
        ),
        Mode(
            name="layerwise",
            layerwise=True,
            scheduling="round-robin",
            read_path="pe-read",
            quota_batching=False,
        ),
        Mode(
            name="dualpath-rr",
            layerwise=True,
            scheduling="round-robin",
            read_path="alternating",
            quota_batching=False,
        ),
        Mode(
            name="dualpath",
            layerwise=True,
            scheduling="dualpath",
            read_path="shorter-queue",
            quota_batching=True,
        ),
        Mode(
            name="oracle",
            layerwise=True,
            scheduling="dualpath",
            read_path="shorter-queue",
            quota_batching=True,
            skip_io=True,
        ),
    )
}


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r} (known: {', '.join(MODES)})") from None
