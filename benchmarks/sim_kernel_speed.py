"""Speed of the simulator's event kernel and fluid link network alone.

Prints a table and writes JSON (default `benchmarks/results/sim_kernel_speed.json`).
Usage: python benchmarks/sim_kernel_speed.py [--scale 1.0] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

from dualpath.sim.kernel import Simulator
from dualpath.sim.links import LinkNetwork, TrafficClass

GB = 1e9


def bench_events(n: int) -> dict[str, float]:
    sim = Simulator()
    rng = random.Random(0)

    def tick() -> None:
        sim.schedule(rng.random(), tick)

    for _ in range(1000):
        sim.schedule(rng.random(), tick)
    t0 = time.perf_counter()
    sim.run(max_events=n)
    wall = time.perf_counter() - t0
    return {"events": n, "wall_s": wall, "events_per_s": n / wall}


def bench_flows(name: str, n: int, make_path: Callable[[LinkNetwork, random.Random], list], concurrency: int,
                cap: int | None = None) -> dict[str, float | str]:  # fmt: skip
    sim = Simulator()
    net = LinkNetwork(sim, max_component_flows=cap)
    rng = random.Random(0)
    paths = make_path(net, rng)
    started = 0

    def start() -> None:
        nonlocal started
        if started < n:
            started += 1
            net.start_flow(rng.uniform(0.1, 2.0) * GB, rng.choice(paths), TrafficClass.LOW, start)

    for _ in range(concurrency):
        start()
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0
    return {"case": name, "flows": n, "concurrency": concurrency, "cap": str(cap), "wall_s": wall,
            "flows_per_s": n / wall, "recomputes": net.recomputes}  # fmt: skip


def single_links(net: LinkNetwork, rng: random.Random) -> list:
    return [[net.add_link(f"l{i}", 50 * GB)] for i in range(64)]


def one_bottleneck(net: LinkNetwork, rng: random.Random) -> list:
    snic = net.add_link("snic", 50 * GB)
    return [[snic]]


def cluster_like(net: LinkNetwork, rng: random.Random) -> list:
    """6 nodes (2P4D): storage -> snic_rx -> dram, and dram -> cnic_tx => cnic_rx -> dram."""
    nodes = range(6)
    snic = {i: net.add_link(f"n{i}/snic_rx", 50 * GB) for i in nodes}
    dram = {i: net.add_link(f"n{i}/dram", 500 * GB) for i in nodes}
    tx = {(i, g): net.add_link(f"n{i}/cnic{g}_tx", 50 * GB) for i in nodes for g in range(8)}
    rx = {(i, g): net.add_link(f"n{i}/cnic{g}_rx", 50 * GB) for i in nodes for g in range(8)}
    paths = [[snic[i], dram[i]] for i in nodes]
    for i in nodes:
        for j in nodes:
            if i != j:
                g = rng.randrange(8)
                paths.append([dram[i], tx[(i, g)], rx[(j, g)], dram[j]])
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sim_kernel_speed.json"))
    args = parser.parse_args()
    n = int(200_000 * args.scale)
    results: dict[str, object] = {"kernel": bench_events(int(1_000_000 * args.scale))}
    cases = [
        bench_flows("alone on own link", n, single_links, 32),
        bench_flows("one bottleneck, 16 flows", n, one_bottleneck, 16),
        bench_flows("one bottleneck, 256 flows", n // 4, one_bottleneck, 256),
        bench_flows("2P4D-like, 64 flows, exact", n // 4, cluster_like, 64),
        bench_flows("2P4D-like, 512 flows, exact", n // 10, cluster_like, 512),
        bench_flows("2P4D-like, 512 flows, cap 64", n // 10, cluster_like, 512, cap=64),
    ]
    results["flows"] = cases
    k = results["kernel"]
    print(f"kernel: {k['events']:,} events in {k['wall_s']:.2f} s = {k['events_per_s']:,.0f} events/s")  # type: ignore[index]
    print(f"{'case':32} {'flows':>8} {'conc':>5} {'wall_s':>7} {'flows/s':>10} {'recomputes':>10}")
    for c in cases:
        print(f"{c['case']:32} {c['flows']:>8} {c['concurrency']:>5} {c['wall_s']:>7.2f} "
              f"{c['flows_per_s']:>10,.0f} {c['recomputes']:>10}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
