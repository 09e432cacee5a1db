"""Timing the runtime's model exactly as the node processes call it (PE: `prefill_layer`, DE: `decode_step`).

Same torch thread count as a node (`runtime/node.py` sets 1 thread per engine process), warm caches (one
untimed call first), median of a few repeats. Inputs are seeded random tensors: a layer's time does not
depend on the values, only on the shapes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dualpath.runtime.model.paged_cache import PagedKVCache
from dualpath.runtime.model.transformer import Transformer
from dualpath.twin.calibration import Tick
from dualpath.twin.calibration_fit import DecodePoint, PrefillPoint


@dataclass(frozen=True, kw_only=True)
class ModelGrid:
    cached_tokens: tuple[int, ...]
    new_tokens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    context_tokens: tuple[int, ...]  # per decode sequence; multiples of 64 (the cost model's bucket)
    head_tokens: tuple[int, ...]  # prompt lengths for the per-forward embedding + LM head
    repeats: int

    def num_points(self) -> int:
        prefill = len(self.cached_tokens) * len(self.new_tokens)
        decode = len(self.batch_sizes) * len(self.context_tokens)
        return prefill + decode + len(self.head_tokens) + 1  # + the weight-read pass


# Chosen to span the runtime's shapes: Full Blocks of 16 tokens, prompts of a few hundred to ~2K tokens
# (the demo's 64K trace scaled by 1/32, docs/runtime.md), DE batches up to 16 sequences.
FULL_GRID = ModelGrid(
    cached_tokens=(0, 256, 1024, 2048),
    new_tokens=(16, 64, 256, 1024),
    batch_sizes=(1, 2, 4, 8, 16),
    context_tokens=(64, 256, 1024, 2048),
    head_tokens=(16, 256, 1024),
    repeats=9,
)
QUICK_GRID = ModelGrid(
    cached_tokens=(0, 256, 1024, 2048),
    new_tokens=(16, 64, 256, 1024),
    batch_sizes=(1, 4, 16),
    context_tokens=(64, 512, 2048),
    head_tokens=(16, 1024),
    repeats=5,
)


def median_time_s(fn: Callable[[], object], repeats: int) -> float:
    """Median over repeats of the CPU time of this thread (one torch thread, as in a node), else wall.

    CPU time is what the kernel costs on an idle core whatever else runs on the host meanwhile; the twin
    adds the sharing of cores with the other runnable threads itself (`sim.host`).
    """
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    fn()  # warm-up: first-call allocations are not part of a steady-state step
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    return statistics.median(samples)


def measure_prefill_layer(
    model: Transformer, grid: ModelGrid, generator: torch.Generator, tick: Tick
) -> list[PrefillPoint]:
    """`prefill_layer` of one middle layer (all layers have the same shapes) over (cached, new)."""
    c = model.config
    layer = c.num_layers // 2
    points = []
    for cached in grid.cached_tokens:
        for new in grid.new_tokens:
            tick(f"prefill {cached}+{new}")
            if cached + new > c.max_position_tokens:
                continue
            hidden = torch.randn(new, c.hidden_size, generator=generator, dtype=c.torch_dtype)
            kv = (
                torch.randn(cached, c.kv_row_elems, generator=generator, dtype=c.torch_dtype)
                if cached
                else None
            )
            positions = torch.arange(cached, cached + new)

            def run(
                h: torch.Tensor = hidden, p: torch.Tensor = positions, k: torch.Tensor | None = kv
            ) -> None:
                model.prefill_layer(layer, h, p, k)

            time_s = median_time_s(run, grid.repeats)
            points.append(PrefillPoint(cached_tokens=cached, new_tokens=new, time_s=time_s))
    return points


def measure_decode_step(
    model: Transformer, grid: ModelGrid, generator: torch.Generator, tick: Tick, *, block_tokens: int
) -> list[DecodePoint]:
    """One DE step as `DecodeExecutor._step` runs it: `decode_step_paged` (contexts read from the paged
    cache, the forward, each new token's KV appended to its pages) and the greedy argmax to a list.

    Each call appends one token per sequence, so the contexts grow by `repeats` + 1 tokens over a point
    (≤ 10: under 2 % of the smallest context); the pages for that growth are allocated up front.
    """
    c = model.config
    points = []
    for batch in grid.batch_sizes:
        for context in grid.context_tokens:
            tick(f"decode {batch}x{context}")
            grown = context + grid.repeats + 1
            if grown > c.max_position_tokens:
                continue
            cache = PagedKVCache(c, num_pages=batch * -(-grown // block_tokens), block_tokens=block_tokens)
            for seq in range(batch):
                cache.allocate(seq, context)
                for layer in range(c.num_layers):
                    rows = torch.randn(context, c.kv_row_elems, generator=generator, dtype=c.torch_dtype)
                    cache.write(seq, layer, 0, rows)
            tokens = [int(t) for t in torch.randint(c.vocab_size, (batch,), generator=generator)]
            seqs = list(range(batch))

            def step(cache: PagedKVCache = cache, tokens: list[int] = tokens, seqs: list[int] = seqs) -> None:
                model.decode_step_paged(cache, seqs, tokens).argmax(dim=-1).tolist()

            points.append(
                DecodePoint(
                    batch_size=batch, context_tokens=context, time_s=median_time_s(step, grid.repeats)
                )
            )
    return points


def measure_forward_head(
    model: Transformer, grid: ModelGrid, generator: torch.Generator, tick: Tick
) -> list[tuple[int, float]]:
    """(new tokens, seconds) of what a PE forward adds to its layers: `embed` and `final` on the last row."""
    c = model.config
    points = []
    for new in grid.head_tokens:
        tick(f"head {new}")
        ids = torch.randint(c.vocab_size, (new,), generator=generator)

        def head(ids: torch.Tensor = ids) -> None:
            hidden = model.embed(ids)
            model.final(hidden[-1:]).argmax(dim=-1)

        points.append((new, median_time_s(head, grid.repeats)))
    return points


def measure_weight_read_bytes_per_s(model: Transformer, repeats: int, tick: Tick) -> float:
    """Achieved rate of streaming every weight tensor once (a reduction reads each byte once)."""
    tick("weight read")
    tensors: Sequence[torch.Tensor] = [t for t in _weight_tensors(model) if t.numel()]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)

    def read_all() -> None:
        for t in tensors:
            t.sum()

    return nbytes / median_time_s(read_all, repeats)


def _weight_tensors(model: Transformer) -> list[torch.Tensor]:
    """Every distinct weight tensor (a tied LM head is the embedding: read once)."""
    found = [v for v in vars(model.weights).values() if isinstance(v, torch.Tensor)]
    for layer in model.weights.layers:
        found.extend(v for v in vars(layer).values() if isinstance(v, torch.Tensor))
    unique = {t.data_ptr(): t for t in found}
    return list(unique.values())
