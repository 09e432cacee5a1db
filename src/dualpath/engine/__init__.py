"""Sans-I/O engine state machines and the cluster core both drivers run (DESIGN §2, docs/core.md)."""

# isort: off
# First: DUALPATH_PURE_PYTHON=1 or an edited .py runs the source, not a stale .so (policy/native.py).
import dualpath.policy.native  # noqa: F401

# isort: on
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
