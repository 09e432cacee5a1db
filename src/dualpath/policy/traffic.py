"""Traffic classes (paper §5.1): model traffic on the high-priority VL, all KV traffic on the low one."""

from __future__ import annotations

import enum


class TrafficClass(enum.Enum):
    HIGH = "high"  # EP AllToAll, TP/CP collectives: must not be delayed by KV
    LOW = "low"  # every KV movement, including loopback H2D/D2H through the CNIC


class TransferKind(enum.Enum):
    COLLECTIVE = "collective"
    STORAGE_READ = "storage_read"  # storage -> SNIC -> DRAM buffer (Full Blocks)
    LAYER_LOAD = "layer_load"  # DRAM buffer -> CNIC -> PE HBM (Layer Blocks)
    KV_OUT = "kv_out"  # PE HBM -> CNIC => DE CNIC -> DE buffer (Layer Blocks)
    H2D = "h2d"  # DE buffer -> DE CNIC -> DE HBM (one shot)
    D2H = "d2h"  # DE HBM -> CNIC -> DRAM (a filled block during decode)
    PERSIST = "persist"  # DRAM -> SNIC -> storage


def traffic_class(kind: TransferKind) -> TrafficClass:
    """Only collectives are model traffic; everything that moves KV yields to them (§5.1)."""
    return TrafficClass.HIGH if kind is TransferKind.COLLECTIVE else TrafficClass.LOW
