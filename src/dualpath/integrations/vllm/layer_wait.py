"""Per-layer completion of one forward step's loads: `wait(layer)` returns when every load of that layer
has landed in the paged cache (paper §4.1, layerwise prefill: layer i+1 loads under layer i's compute)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable


class LoadTimeout(RuntimeError):
    """A layer's KV did not arrive in time (a lost DE read or a stalled store)."""


class LayerLoads:
    def __init__(self, num_layers: int) -> None:
        self._cond = threading.Condition()
        self._pending = [0] * num_layers
        self.invalid_block_ids: set[int] = set()  # vLLM blocks whose load failed (to be recomputed)
        self.landed_at_s: list[float] = [0.0] * num_layers  # when each layer's last load landed

    def expect(self, layer: int, units: int) -> None:
        with self._cond:
            self._pending[layer] += units

    def done(self, layer: int, units: int = 1, *, invalid_ids: Iterable[int] = ()) -> None:
        with self._cond:
            self.invalid_block_ids.update(invalid_ids)
            self._pending[layer] -= units
            if self._pending[layer] <= 0:
                self.landed_at_s[layer] = time.monotonic()
                self._cond.notify_all()

    def wait(self, layer: int, timeout_s: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending[layer] <= 0, timeout=timeout_s):
                raise LoadTimeout(
                    f"layer {layer}: {self._pending[layer]} loads still missing after {timeout_s} s"
                )

    def wait_all(self, timeout_s: float) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: max(self._pending, default=0) <= 0, timeout=timeout_s):
                raise LoadTimeout(f"loads still missing after {timeout_s} s: {self._pending}")

    def fail_all(self, block_ids: Iterable[int]) -> None:
        """Give up on every pending load: its blocks are reported invalid, so vLLM recomputes them."""
        with self._cond:
            self.invalid_block_ids.update(block_ids)
            self._pending = [0] * len(self._pending)
            self._cond.notify_all()
