"""The layerwise prefill pipeline of one PE forward (paper §4.1, Fig. 4) as a sans-I/O state machine.

NOTE: layer i computes only when its Layer Blocks are in HBM and layer i-1 has computed; the load of
layer i+1 overlaps the compute of layer i; after layer i computes, its KV goes out to the DE buffer.
At most `hbm_layers` layers are resident (load i+1, compute i, send i-1), so a load waits for a free slot:

    load  | L0 | L1 | L2 | ...
    comp       | L0 | L1 | L2 | ...
    xfer            | L0 | L1 | ...

With equal per-layer load and compute time t and L layers the forward takes (L + 1)·t (+ one xfer).
The runtime runs this per step for real; the simulator uses the closed form of the same pipeline
(`dualpath.sim.prefill_timing`) so it does not pay three events per layer per batch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class LayerOp:
    kind: str  # "load" | "compute" | "send"
    layer: int


class LayerwisePipeline:
    def __init__(self, num_layers: int, *, hbm_layers: int = 3) -> None:
        if num_layers < 1 or hbm_layers < 1:
            raise ValueError("num_layers and hbm_layers must be >= 1")
        self.num_layers = num_layers
        self.hbm_layers = hbm_layers
        self._next_load = 0
        self._loaded = 0  # layers whose load finished (in order)
        self._next_compute = 0
        self._computing = False
        self._computed = 0
        self._sent = 0
        self._loading = False
        self._sending: set[int] = set()

    def start(self) -> list[LayerOp]:
        return self._issue()

    def on_loaded(self, layer: int) -> list[LayerOp]:
        assert self._loading and layer == self._loaded, (layer, self._loaded)
        self._loading = False
        self._loaded += 1
        return self._issue()

    def on_computed(self, layer: int) -> list[LayerOp]:
        assert self._computing and layer == self._computed, (layer, self._computed)
        self._computing = False
        self._computed += 1
        self._sending.add(layer)
        return [LayerOp(kind="send", layer=layer), *self._issue()]

    def on_sent(self, layer: int) -> list[LayerOp]:
        self._sending.remove(layer)
        self._sent += 1
        return self._issue()

    @property
    def done(self) -> bool:
        return self._sent == self.num_layers

    def _issue(self) -> list[LayerOp]:
        ops: list[LayerOp] = []
        # A layer stays resident from its load until its KV is sent (the send reads HBM).
        resident = self._loaded - self._sent + (1 if self._loading else 0)
        if not self._loading and self._next_load < self.num_layers and resident < self.hbm_layers:
            self._loading = True
            ops.append(LayerOp(kind="load", layer=self._next_load))
            self._next_load += 1
        if not self._computing and self._computed < self._loaded:
            self._computing = True
            ops.append(LayerOp(kind="compute", layer=self._computed))
        return ops

    def check_invariants(self) -> None:
        assert self._sent <= self._computed <= self._loaded <= self._next_load <= self.num_layers
        assert self._loaded - self._sent <= self.hbm_layers
