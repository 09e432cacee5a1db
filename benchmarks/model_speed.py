"""Speed of the runtime's model on this machine: one layer's prefill and one decode step.

Per-layer prefill time vs (cached, new) tokens and decode-step time vs (batch, context) for a model
preset (default tiny-llama) on the configured device. A calibrate step fits the PE/DE cost model to
these points. Prints a table and writes JSON (default `benchmarks/results/model_speed.json`).
Usage: python benchmarks/model_speed.py [--model tiny-llama] [--device cpu] [--threads 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from dualpath.config.loader import load_model
from dualpath.runtime.model import Transformer, config_from_model_spec

FULL_GRID = {
    "prefill_cached_tokens": [0, 512, 2048, 4096],
    "prefill_new_tokens": [16, 64, 256, 1024],
    "decode_batch": [1, 4, 16],
    "decode_context_tokens": [256, 1024, 4096],
}
QUICK_GRID = {
    "prefill_cached_tokens": [0, 512],
    "prefill_new_tokens": [16, 128],
    "decode_batch": [1, 4],
    "decode_context_tokens": [128, 512],
}


def median_time_s(run: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    run()  # warm-up: first-call allocations and kernel selection
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_prefill_layer(
    model: Transformer, cached: int, new: int, repeats: int, sync: Callable[[], None]
) -> dict[str, float]:
    config, generator = model.config, torch.Generator().manual_seed(cached * 7919 + new)
    cached_kv = torch.randn(cached, config.kv_row_elems, generator=generator).to(
        config.device, config.torch_dtype
    )
    hidden = model.embed(torch.randint(0, config.vocab_size, (new,), generator=generator))
    positions = torch.arange(cached, cached + new, device=config.device)
    elapsed = median_time_s(lambda: model.prefill_layer(0, hidden, positions, cached_kv), repeats, sync)
    return {"cached_tokens": cached, "new_tokens": new, "layer_time_s": elapsed}


def bench_decode_step(
    model: Transformer, batch: int, context: int, repeats: int, sync: Callable[[], None]
) -> dict[str, float]:
    config, generator = model.config, torch.Generator().manual_seed(batch * 7919 + context)
    kv = [
        torch.randn(context, config.kv_row_elems, generator=generator).to(config.device, config.torch_dtype)
        for _ in range(config.num_layers)
    ]
    tokens = torch.randint(0, config.vocab_size, (batch,), generator=generator).tolist()
    elapsed = median_time_s(lambda: model.decode_step(tokens, [kv] * batch), repeats, sync)
    return {"batch": batch, "context_tokens": context, "step_time_s": elapsed}


def cpu_and_wall_s(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median thread CPU and wall seconds of `run` after one warm-up (one torch thread: CPU = the kernel's
    own cost on a core, whatever else the host runs)."""
    run()
    cpu, wall = [], []
    for _ in range(repeats):
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        run()
        cpu.append(time.thread_time() - cpu0)
        wall.append(time.perf_counter() - wall0)
    return statistics.median(cpu), statistics.median(wall)


def forward_time_s(
    model: Transformer, items: list[tuple[int, int, bool]], repeats: int = 3
) -> tuple[float, float]:
    """(CPU, wall) of one raw forward of a PE step's shapes: each item (cached, new, completes) embedded,
    run through every layer over random cached KV, and its last row through the head when it completes."""
    config, generator = model.config, torch.Generator().manual_seed(len(items))
    shapes = []
    for cached, new, completes in items:
        kv = torch.randn(cached, config.kv_row_elems, generator=generator) if cached else None
        ids = torch.randint(0, config.vocab_size, (new,), generator=generator).tolist()
        shapes.append((kv, ids, torch.arange(cached, cached + new), completes))

    def forward() -> None:
        hidden = [model.embed(ids) for _, ids, _, _ in shapes]
        for layer in range(config.num_layers):
            for i, (kv, _, positions, _) in enumerate(shapes):
                hidden[i], _ = model.prefill_layer(layer, hidden[i], positions, kv)
        for h, (_, _, _, completes) in zip(hidden, shapes, strict=True):
            if completes:
                model.final(h[-1:])

    return cpu_and_wall_s(forward, repeats)


def decode_time_s(model: Transformer, contexts: list[int], repeats: int = 3) -> tuple[float, float]:
    """(CPU, wall) of one raw decode step (`decode_step_paged`) of sequences with these context lengths."""
    from dualpath.runtime.model.paged_cache import PagedKVCache

    config, block = model.config, 16
    pages = sum(-(-(c + 1) // block) for c in contexts) + 1
    cache = PagedKVCache(config, num_pages=pages, block_tokens=block)
    samples: list[tuple[float, float]] = []
    for _ in range(repeats + 1):  # the first is the warm-up
        for seq, context in enumerate(contexts):
            if seq in cache:
                cache.free(seq)
            cache.allocate(seq, context)
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        model.decode_step_paged(cache, list(range(len(contexts))), [1] * len(contexts))
        samples.append((time.thread_time() - cpu0, time.perf_counter() - wall0))
    return statistics.median(c for c, _ in samples[1:]), statistics.median(w for _, w in samples[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a small grid, for a smoke run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "model_speed.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = load_model(args.model)
    model = Transformer.random(config_from_model_spec(spec, device=args.device), seed=0)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    grid = QUICK_GRID if args.quick else FULL_GRID
    prefill_points = [(c, n) for c in grid["prefill_cached_tokens"] for n in grid["prefill_new_tokens"]]
    decode_points = [(b, c) for b in grid["decode_batch"] for c in grid["decode_context_tokens"]]
    with tqdm(total=len(prefill_points) + len(decode_points), desc="model_speed") as progress:
        prefill = []
        for cached, new in prefill_points:
            prefill.append(bench_prefill_layer(model, cached, new, args.repeats, sync))
            progress.update()
        decode = []
        for batch, context in decode_points:
            decode.append(bench_decode_step(model, batch, context, args.repeats, sync))
            progress.update()
    print(f"\n{args.model} on {args.device} ({args.threads} threads), median of {args.repeats}")
    print(f"{'cached':>8} {'new':>6} {'layer ms':>10} {'new tok/s':>11}")
    for row in prefill:
        rate = row["new_tokens"] / row["layer_time_s"] / spec.num_layers
        print(
            f"{row['cached_tokens']:>8} {row['new_tokens']:>6} {row['layer_time_s'] * 1e3:>10.2f} {rate:>11.0f}"
        )
    print(f"{'batch':>8} {'context':>8} {'step ms':>10}")
    for row in decode:
        print(f"{row['batch']:>8} {row['context_tokens']:>8} {row['step_time_s'] * 1e3:>10.2f}")
    result = {
        "model": args.model,
        "device": args.device,
        "threads": args.threads,
        "repeats": args.repeats,
        "torch_version": torch.__version__,
        "num_layers": spec.num_layers,
        "prefill_layer": prefill,
        "decode_step": decode,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
