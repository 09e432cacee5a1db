"""Speed of the simulator's event kernel and fluid link network alone.

Every flow case runs on the fast `LinkNetwork` and on the original per-flow `ReferenceLinkNetwork`
(the "before"), interleaved so that machine noise hits both alike; `--no-reference` skips the latter.
Rates are per second of this process's CPU time (`time.process_time`), not wall time: the machine is
shared, and CPU time is what a loaded machine does not inflate. Prints a table and writes JSON (default `benchmarks/results/sim_kernel_speed.json`).
Usage: python benchmarks/sim_kernel_speed.py [--scale 1.0] [--out PATH] [--no-reference]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dualpath.sim.kernel import Simulator
from dualpath.sim.links import LinkNetwork, TrafficClass

# The original per-flow network is a test-only oracle (tests/sim/links_reference.py), not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sim"))
from links_reference import ReferenceLinkNetwork  # noqa: E402

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
                network: type = LinkNetwork) -> dict[str, float | str]:  # fmt: skip
    sim = Simulator()
    net = network(sim)
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
    t0, c0 = time.perf_counter(), time.process_time()
    sim.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"case": name, "flows": n, "concurrency": concurrency, "network": network.__name__, "wall_s": wall,
            "cpu_s": cpu, "flows_per_s": n / cpu, "recomputes": net.recomputes}  # fmt: skip


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


def gpu48_like(net: LinkNetwork, rng: random.Random) -> list:
    """`dualpath.sim.topology` hops on 6 nodes x 8 GPUs (2P4D): storage, SNIC rx/tx, DRAM, per GPU the
    CNIC's PCIe read/write sides and the GPU's PCIe down/up; paths read, load (both read paths), KV out,
    H2D, persist, between random GPUs."""
    g = 8
    storage = net.add_link("storage", 6 * 50 * GB)
    node = [
        {
            "snic_rx": net.add_link(f"n{n}/snic_rx", 50 * GB),
            "snic_tx": net.add_link(f"n{n}/snic_tx", 50 * GB),
            "dram": net.add_link(f"n{n}/dram", 500 * GB),
            **{
                f"{kind}{i}": net.add_link(f"n{n}/{kind}{i}", 50 * GB)
                for kind in ("cr", "cw")
                for i in range(g)
            },
            **{
                f"{kind}{i}": net.add_link(f"n{n}/{kind}{i}", 64 * GB)
                for kind in ("down", "up")
                for i in range(g)
            },
        }
        for n in range(6)
    ]
    pe_nodes, de_nodes = (0, 1), (2, 3, 4, 5)
    paths: list[list] = []
    for _ in range(96):
        p, d = node[rng.choice(pe_nodes)], node[rng.choice(de_nodes)]
        i, j = rng.randrange(g), rng.randrange(g)
        paths += [
            [storage, p["snic_rx"], p["dram"]],  # read (PE path)
            [storage, d["snic_rx"], d["dram"]],  # read (DE path)
            [p["dram"], p[f"cr{i}"], p[f"cw{i}"], p[f"down{i}"]],  # load, PE path
            [d["dram"], d[f"cr{j}"], p[f"cw{i}"], p[f"down{i}"]],  # load, DE path
            [p[f"up{i}"], p[f"cr{i}"], d[f"cw{j}"], d["dram"]],  # KV out
            [d["dram"], d[f"cr{j}"], d[f"cw{j}"], d[f"down{j}"]],  # H2D on the DE
            [d["dram"], d["snic_tx"], storage],  # persist
        ]
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sim_kernel_speed.json"))
    parser.add_argument("--no-reference", action="store_true", help="skip the original network (slow)")
    args = parser.parse_args()
    n = int(200_000 * args.scale)
    results: dict[str, object] = {"kernel": bench_events(int(1_000_000 * args.scale))}
    networks = [LinkNetwork] if args.no_reference else [ReferenceLinkNetwork, LinkNetwork]
    plans = [
        ("alone on own link", n, single_links, 32),
        ("one bottleneck, 16 flows", n, one_bottleneck, 16),
        ("one bottleneck, 256 flows", n // 4, one_bottleneck, 256),
        ("2P4D-like, 64 flows", n // 4, cluster_like, 64),
        ("2P4D-like, 512 flows", n // 10, cluster_like, 512),
        ("48-GPU hops, 64 flows", n // 4, gpu48_like, 64),
        ("48-GPU hops, 512 flows", n // 10, gpu48_like, 512),
    ]
    cases = [
        bench_flows(name, count, make, conc, net) for name, count, make, conc in plans for net in networks
    ]
    results["flows"] = cases
    k = results["kernel"]
    print(f"kernel: {k['events']:,} events in {k['wall_s']:.2f} s = {k['events_per_s']:,.0f} events/s")  # type: ignore[index]
    print(
        f"{'case':28} {'flows':>7} {'conc':>5} {'before flows/s':>15} {'after flows/s':>14} {'speed-up':>9}"
    )
    for name, count, _, conc in plans:
        by = {c["network"]: c["flows_per_s"] for c in cases if c["case"] == name}
        after = float(by["LinkNetwork"])
        before = by.get("ReferenceLinkNetwork")
        b_txt, x_txt = (
            ("-", "-") if before is None else (f"{float(before):,.0f}", f"{after / float(before):.1f}x")
        )
        print(f"{name:28} {count:>7} {conc:>5} {b_txt:>15} {after:>14,.0f} {x_txt:>9}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
