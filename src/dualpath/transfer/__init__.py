"""Transfer library (runtime data plane): registered buffers, one-sided writes with notices, emulated NICs
with traffic classes, storage I/O through the SNIC (docs/transfer.md). Independent of the engine; no torch."""

from dualpath.transfer.backend import TransferBackend
from dualpath.transfer.inprocess import InProcessBackend, InProcessFabric
from dualpath.transfer.nic import EmulatedNic, NicStats, ReadQueue, Snic
from dualpath.transfer.paced import PacedBackend
from dualpath.transfer.ratelimit import DEFAULT_WEIGHTS, LimiterStats, RateLimiter
from dualpath.transfer.shm_backend import SharedMemoryBackend
from dualpath.transfer.storage_io import (
    BlockRead,
    BlockWrite,
    ReadJob,
    ReadResult,
    StorageReader,
    StorageWriter,
    WriteJob,
)
from dualpath.transfer.tcp_backend import TcpBackend
from dualpath.transfer.types import Notice, TrafficClass, TransferSpec

__all__ = [
    "DEFAULT_WEIGHTS",
    "BlockRead",
    "BlockWrite",
    "EmulatedNic",
    "InProcessBackend",
    "InProcessFabric",
    "LimiterStats",
    "NicStats",
    "Notice",
    "PacedBackend",
    "RateLimiter",
    "ReadJob",
    "ReadQueue",
    "ReadResult",
    "SharedMemoryBackend",
    "Snic",
    "StorageReader",
    "StorageWriter",
    "TcpBackend",
    "TrafficClass",
    "TransferBackend",
    "TransferSpec",
    "WriteJob",
]
