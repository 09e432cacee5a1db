"""The connector's settings, read from vLLM's `kv_transfer_config.kv_connector_extra_config` (docs/vllm.md).

No vLLM import here: the settings are plain values, checked once, so a typo fails at start-up with the key's
name instead of deep inside a forward pass.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

READ_PATHS = ("pe", "de")
LOAD_MODES = ("staged", "layerwise")  # connector.py says what each does


@dataclass(frozen=True, kw_only=True)
class ConnectorConfig:
    store_dir: str = ""  # required: the FileStore directory (a shared filesystem mount across hosts)
    store_capacity_bytes: int = 64 * 2**30
    # Full Block = this many vLLM blocks (paper §4.1: a Full Block is the unit of storage).
    full_block_vllm_blocks: int = 1
    load_mode: str = "staged"
    # Emulated SNIC of this instance (paper §2.3, EMULATION); 0 = no limit (a real NIC, or tests).
    snic_bytes_per_s: float = 0.0
    # Default read path for a hit when the request's kv_transfer_params name none (paper §4: PE or DE read).
    read_path: str = "pe"
    # DE read path: the shared-memory namespace of one host, this instance's endpoint name, and the DE
    # endpoint that reads for it (its name; the address follows from the namespace).
    namespace: str = "dualpath"
    endpoint: str = ""
    de_endpoint: str = ""
    de_serve_endpoint: str = ""  # set: this instance also serves DE reads for prefill instances, as this name
    de_buffer_bytes: int = 64 * 2**20  # this instance's receive buffer for DE-read Layer Blocks
    # Transport of DE reads and the PD hand-off: "shm" (one host) or "tcp" (across hosts; endpoints.py).
    transport: str = "shm"
    listen_host: str = "127.0.0.1"  # tcp: this instance's endpoint listens here
    listen_port: int = 0  # tcp: its port (0: any; a fixed one lets peers name it); + rank with TP
    de_serve_port: int = 0  # tcp: the port of the DE read service (de_serve_endpoint); + rank with TP
    peers: str = ""  # tcp: "name=tcp://host:port,..." for the DE endpoints and prefill instances it asks
    # Wait for each step's persisted blocks to reach the store before the step returns (deterministic hits
    # for tests and benchmarks; off, the writes run behind the next steps).
    persist_wait: bool = False
    # Write this instance's SNIC counters (JSON) to this file twice a second (demos read them across processes).
    stats_file: str = ""
    # Record hook timestamps (start/end of each layer's load and compute) for the overlap check.
    record_timeline: bool = False

    def __post_init__(self) -> None:
        if not self.store_dir:
            raise ValueError("kv_connector_extra_config needs 'store_dir' (the DualPath FileStore directory)")
        if self.read_path not in READ_PATHS:
            raise ValueError(f"read_path must be one of {READ_PATHS}, got {self.read_path!r}")
        if self.transport not in ("shm", "tcp"):
            raise ValueError(f"transport must be shm or tcp, got {self.transport!r}")
        if self.load_mode not in LOAD_MODES:
            raise ValueError(f"load_mode must be one of {LOAD_MODES}, got {self.load_mode!r}")
        if self.full_block_vllm_blocks <= 0:
            raise ValueError(f"full_block_vllm_blocks must be positive, got {self.full_block_vllm_blocks}")
        if self.snic_bytes_per_s < 0:
            raise ValueError(f"snic_bytes_per_s must be >= 0, got {self.snic_bytes_per_s}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> ConnectorConfig:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config keys {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {"store_dir": ""}
        for name, value in extra.items():
            kind = type(known[name].default)
            values[name] = _coerce(name, value, kind)
        return cls(**values)


def _coerce(name: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, str):
            return value.lower() in ("1", "true", "yes", "on")
        return bool(value)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"kv_connector_extra_config[{name!r}] must be {kind.__name__}, got {value!r}"
        ) from None


def shard_dir(store_dir: str, rank: int, size: int) -> str:
    """Where one tensor-parallel rank keeps its Full Blocks: each rank's paged cache holds its own heads, so
    the ranks' blocks of one key differ. One rank: the directory itself."""
    return store_dir if size == 1 else os.path.join(store_dir, f"tp{rank}of{size}")


def shard_name(endpoint: str, rank: int, size: int) -> str:
    """A rank's shared-memory endpoint: DE reads pair rank r of a prefill instance with rank r of a decode one."""
    return endpoint if size == 1 or not endpoint else f"{endpoint}-tp{rank}"
