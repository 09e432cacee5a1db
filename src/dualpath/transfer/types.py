"""What a transfer is: source, destination, bytes, layer range and traffic class (DESIGN §4 "transfer")."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

JsonDict = dict[str, Any]  # notices carry JSON types only: KV bytes never travel inside a notice


class TrafficClass(enum.IntEnum):
    """Paper §5.1: model-inference traffic rides a high-priority lane, everything else (KV) a low one."""

    HIGH = 0
    LOW = 1


@dataclass(frozen=True, kw_only=True)
class TransferSpec:
    """One transfer, as named in notices and metrics. Layers are the half-open range [layer_start, layer_stop)."""

    source: str
    destination: str
    buffer_name: str
    offset_bytes: int
    nbytes: int
    layer_start: int = 0
    layer_stop: int = 0
    traffic_class: TrafficClass = TrafficClass.LOW

    def to_notice(self) -> JsonDict:
        return {
            "source": self.source,
            "destination": self.destination,
            "buffer_name": self.buffer_name,
            "offset_bytes": self.offset_bytes,
            "nbytes": self.nbytes,
            "layer_start": self.layer_start,
            "layer_stop": self.layer_stop,
            "traffic_class": self.traffic_class.name,
        }

    @classmethod
    def from_notice(cls, notice: JsonDict) -> TransferSpec:
        fields = {k: notice[k] for k in cls.__dataclass_fields__ if k != "traffic_class"}
        return cls(**fields, traffic_class=TrafficClass[notice["traffic_class"]])


@dataclass(frozen=True, kw_only=True)
class Notice:
    """Completion notice of a one-sided write: once the receiver sees it, the bytes are in its buffer.

    A notice sent with `notify` (no data) has buffer_name "" and nbytes 0."""

    src: str
    buffer_name: str
    offset_bytes: int
    nbytes: int
    payload: JsonDict = field(default_factory=dict)
    error: str = ""  # non-empty: the write was refused at the receiver (e.g. out of range); no bytes landed

    def to_wire(self) -> JsonDict:
        return {
            "src": self.src,
            "buffer_name": self.buffer_name,
            "offset_bytes": self.offset_bytes,
            "nbytes": self.nbytes,
            "payload": self.payload,
            "error": self.error,
        }

    @classmethod
    def from_wire(cls, wire: JsonDict) -> Notice:
        return cls(**wire)
