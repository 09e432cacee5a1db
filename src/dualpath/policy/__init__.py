"""The sans-I/O decision core (paper §6): who serves a request, which path reads it, what a batch holds.

No clocks, no randomness, no I/O, no threads (DESIGN §2); the simulator and the runtime call this
same code. See docs/core.md.
"""

from dualpath.policy.batching import BatchItem, PrefillWork, pack_by_compute_quota, pack_by_token_budget
from dualpath.policy.decisions import Assignment, BatchDecision, DecisionLog
from dualpath.policy.read_path import READ_PATH_POLICIES, ReadPathPolicy, make_read_path_policy
from dualpath.policy.scheduler import RequestScheduler
from dualpath.policy.traffic import TrafficClass, TransferKind, traffic_class
from dualpath.policy.types import EngineLoad, NodeReadState, ReadPlan, ReadSide

__all__ = [
    "READ_PATH_POLICIES",
    "Assignment",
    "BatchDecision",
    "BatchItem",
    "DecisionLog",
    "EngineLoad",
    "NodeReadState",
    "PrefillWork",
    "ReadPathPolicy",
    "ReadPlan",
    "ReadSide",
    "RequestScheduler",
    "TrafficClass",
    "TransferKind",
    "make_read_path_policy",
    "pack_by_compute_quota",
    "pack_by_token_budget",
    "traffic_class",
]
