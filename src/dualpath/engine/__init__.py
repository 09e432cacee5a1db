"""Sans-I/O engine state machines and the cluster core both drivers run (DESIGN §2, docs/core.md)."""

from dualpath.engine.commands import (
    Command,
    DecodeChanged,
    RequestDone,
    StartH2D,
    StartPersist,
    StartPrefillStep,
    StartRead,
    StepItem,
    TokenMilestone,
)
from dualpath.engine.core import ClusterCore, CoreConfig
from dualpath.engine.modes import MODES, Mode, get_mode
from dualpath.engine.pipeline import LayerOp, LayerwisePipeline

__all__ = [
    "MODES",
    "ClusterCore",
    "Command",
    "CoreConfig",
    "DecodeChanged",
    "LayerOp",
    "LayerwisePipeline",
    "Mode",
    "RequestDone",
    "StartH2D",
    "StartPersist",
    "StartPrefillStep",
    "StartRead",
    "StepItem",
    "TokenMilestone",
    "get_mode",
]
