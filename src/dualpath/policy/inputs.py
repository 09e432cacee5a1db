"""The policy's inputs, derived once for every driver: α, β and the §6.4 quota predictor (paper A.4).

NOTE: the drivers profile their PEs and storage paths their own way: the simulator from its cost model
(the rate of a forward of the workload's typical rounds packed to the quota, `sim/rates.py`), the runtime
from its PE's start-up measurement (`runtime/model_host.py`), the twin as the runtime does. What those
figures mean, and how α and β follow from them, is written here alone.

- α: hit tokens one node's storage path reads in `alpha_read_s` (A.4: 3 s). It bounds the disk side of
  a node's load (Algorithm 1's C2/C3 split on read_q).
- β: miss tokens one PE GPU computes in `beta_compute_s` (A.4: 5 s). It bounds the GPU side (C1).
- The quota predictor: a forward's attention time on one GPU, all layers, for its (cached, new) items
  (§6.4: requests are packed while the predicted attention time stays within the quota).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dualpath.config.specs import SchedulerSpec
from dualpath.policy.batching import AttentionTimeFn


@dataclass(frozen=True, kw_only=True)
class PrefillProfile:
    """What a driver profiled of one PE GPU (A.4 "profiled", §6.4 "pre-profiled fit")."""

    tokens_per_s: float  # miss tokens it computes per second while busy
    attention_time_s: AttentionTimeFn  # a forward's attention time on it, all layers


@dataclass(frozen=True, kw_only=True)
class PolicyInputs:
    read_tokens_per_s: float  # one node's storage path (its SNIC), in hit tokens/s
    alpha_tokens: float  # §6.1 α
    beta_tokens: float  # §6.1 β (C1: compute_tok > β)
    attention_time_s: AttentionTimeFn  # §6.4 quota predictor


def policy_inputs(
    spec: SchedulerSpec, *, read_bytes_per_s: float, kv_bytes_per_token: float, prefill: PrefillProfile
) -> PolicyInputs:
    """α and β as A.4 defines them, from a node's read rate and a PE GPU's prefill profile."""
    if read_bytes_per_s <= 0 or kv_bytes_per_token <= 0 or prefill.tokens_per_s <= 0:
        raise ValueError(
            f"policy inputs need positive rates: read {read_bytes_per_s} B/s, "
            f"KV {kv_bytes_per_token} B/token, prefill {prefill.tokens_per_s} tokens/s"
        )
    read_tokens_per_s = read_bytes_per_s / kv_bytes_per_token
    return PolicyInputs(
        read_tokens_per_s=read_tokens_per_s,
        alpha_tokens=spec.alpha_read_s * read_tokens_per_s,
        beta_tokens=spec.beta_compute_s * prefill.tokens_per_s,
        attention_time_s=prefill.attention_time_s,
    )


def pairwise_attention_time(s_per_token_pair: float) -> AttentionTimeFn:
    """The quota predictor from a measured cost per query-key pair (`runtime/model_host.py` measures it
    as the extra time of new tokens over a cached prefix): a chunk of `new` tokens over `cached` ones
    attends new × (cached + new) pairs, the new block's own counted whole."""

    def predict(requests: Sequence[tuple[int, int]]) -> float:
        return s_per_token_pair * sum(new * (cached + new) for cached, new in requests)

    return predict
