"""Closed form of the layerwise pipeline for one PE forward, so the simulator needs no per-layer events.

NOTE: the loads of a step run as one flow per hop (all layers' bytes), started with the step. If the
load flows finish at `t_load` and the per-layer compute times are c_0..c_{L-1} (Σ = C), layer 0's
blocks arrive at ≈ start + (t_load - start)/L (the flows run at a steady rate), so

    end = max(start + (t_load - start)/L + C,     compute-bound: the first load, then all compute
              t_load + c_{L-1})                   load-bound: the last load, then the last compute

which is the `engine.pipeline.LayerwisePipeline` schedule: equal per-layer load and compute t give
(L + 1)·t. Without layerwise (basic) the whole KV is loaded first: end = t_load + C.
"""

from __future__ import annotations


def layerwise_end_s(
    *, start_s: float, load_done_s: float, layers: int, compute_s: float, last_layer_s: float
) -> float:
    first_load_s = (load_done_s - start_s) / layers
    return max(start_s + first_load_s + compute_s, load_done_s + last_layer_s)


def whole_kv_end_s(*, load_done_s: float, compute_s: float) -> float:
    return load_done_s + compute_s
