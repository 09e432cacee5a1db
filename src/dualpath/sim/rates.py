"""What the simulator profiles from its physics for the core: HBM KV capacities, read and prefill rates.

Every value is computed from the specs and the cost model (paper A.4 defines α and β as profiled
rates; here the "profile" is the cost model), never fitted to a result; α, β and the quota predictor
follow from the profile in `policy.inputs`, as for every driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dualpath.architecture import arch
from dualpath.config.specs import ClusterSpec, ModelSpec
from dualpath.policy.batching import PrefillWork, pack_by_compute_quota
from dualpath.policy.inputs import PolicyInputs, PrefillProfile, policy_inputs
from dualpath.sim.cost import CostModel

# Share of HBM a serving engine keeps outside its KV pool for activations, CUDA graphs and workspace:
# vLLM's default `gpu_memory_utilization` = 0.9 (vLLM engine arguments).
HBM_NON_KV_FRACTION: Final = 0.10


def routed_expert_bytes(m: ModelSpec) -> float:
    """Weights of all routed experts: the part expert parallelism shards across GPUs."""
    f = m.ffn
    if not f.num_routed_experts:
        return 0.0
    per_expert = 3 * m.hidden_size * f.moe_intermediate_size * m.weight_bytes_per_param  # SwiGLU: 3 mats
    moe_layers = sum(1 for i in range(m.num_layers) if arch.is_moe_layer(m, i))
    return moe_layers * f.num_routed_experts * per_expert


def hbm_kv_tokens(cluster: ClusterSpec, *, role_gpus: int) -> int:
    """KV tokens one GPU holds: HBM less the non-KV share, less its weights.

    Routed experts are sharded over all GPUs of the role (EP = P·g or D·g; the paper says only
    "EP + DP", §7.1, and DeepSeek-V3.2's experts need EP >= 16 to fit 80 GB); the rest is replicated.
    """
    m, gpu = cluster.model, cluster.hardware.gpu
    routed = routed_expert_bytes(m)
    per_gpu_weights = arch.weight_bytes(m) - routed + routed / role_gpus
    free = gpu.hbm_bytes * (1 - HBM_NON_KV_FRACTION) - per_gpu_weights
    if free <= 0:
        raise ValueError(
            f"{m.name} does not fit {role_gpus} x {gpu.name}: {per_gpu_weights / 1e9:.1f} GB of weights per GPU"
        )
    return int(free // arch.kv_bytes_per_token(m))


def attention_predictor(cost: CostModel, layers: int):  # type: ignore[no-untyped-def]
    """The §6.4 quota predictor (`policy.inputs`): a forward's attention time on one GPU, all layers:
    the cost model's per-layer attention times the layer count."""

    def predict(requests: Sequence[tuple[int, int]]) -> float:
        return layers * cost.attention_layer_time_s(requests)

    return predict


def core_rates(
    cluster: ClusterSpec, cost: CostModel, *, context_tokens: int, append_tokens: int
) -> PolicyInputs:
    """α, β and the quota predictor from the simulator's profile: a node reads at its SNIC's rate (or its
    share of the storage cluster's, if lower); a PE GPU computes at the rate of a forward of typical
    requests (the dataset's mean context and append) packed to the compute quota on every GPU of the
    node: the compute throughput a PE sustains when busy.
    """
    hw, s, m = cluster.hardware, cluster.scheduler, cluster.model
    nodes = cluster.num_prefill_nodes + cluster.num_decode_nodes
    read_bytes_per_s = min(hw.snic_bytes_per_s, hw.storage_bytes_per_s / nodes)
    predictor = attention_predictor(cost, m.num_layers)
    cached = max(0, context_tokens - append_tokens)
    typical = [
        PrefillWork(request_id=i, cached_tokens=cached, remaining_tokens=append_tokens) for i in range(4096)
    ]
    batch = pack_by_compute_quota(typical, attention_time_s=predictor, quota_s=s.compute_quota_s)
    pairs = [(b.cached_tokens, b.new_tokens) for b in batch]
    forward_s = cost.prefill_forward_time_s([pairs] * hw.gpus_per_node)
    computed_tokens = sum(n for _, n in pairs)  # per GPU: each GPU of the node runs `pairs`
    prefill = PrefillProfile(tokens_per_s=computed_tokens / max(forward_s, 1e-9), attention_time_s=predictor)
    return policy_inputs(
        s, read_bytes_per_s=read_bytes_per_s, kv_bytes_per_token=arch.kv_bytes_per_token(m), prefill=prefill
    )
