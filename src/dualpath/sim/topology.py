"""The simulated cluster's links and the hops each KV movement crosses (paper §3, Fig. 4).

Per node n: `n/snic_rx`, `n/snic_tx` (storage NIC), `n/dram` (half-duplex: reads and writes share
it, §4.2), and per GPU i: `n/cnic{i}_read` (bytes the CNIC pulls over PCIe: everything it sends, to the
wire or in loopback), `n/cnic{i}_write` (bytes it pushes over PCIe), `n/gpu{i}_down` / `n/gpu{i}_up`
(the GPU's PCIe link into / out of HBM). The 3FS cluster is two aggregate links, `storage_read` and
`storage_write`, one per direction like every NIC (its figure, 6.6 TiB/s, is a read throughput; the
storage nodes' NICs are full duplex, so writes do not take reads' bandwidth; no write figure is
published, so `storage_write` takes the same one, an assumption). Counting a CNIC by its PCIe read and write sides is exactly the §4.2 accounting
(loopback H2D/D2H never reaches the switch).

NOTE: PE GPU i reaches the DE *buffer* (node-wide host DRAM) through the DE node's rail-i CNIC, the
NIC on its own rail of a rail-optimised fabric (same-rank NICs share a leaf switch), whatever DE GPU
the request decodes on; only the H2D/D2H between the buffer and DE GPU j use CNIC j. The paper does
not say which DE CNIC serves the buffer; with every PE rank equally loaded this spreads the buffer's
traffic evenly over the DE CNICs (§4.2's balance assumption), and a step's flows are one per (PE GPU,
DE node) instead of one per (PE GPU, DE GPU).

    read            storage_read -> n/snic_rx -> n/dram                         (Fig. 4 steps 1-2)
    load, PE path   p/dram -> p/cnic_read -> p/cnic_write -> p/gpu_down        (4a steps 3-4, loopback)
    load, DE path   d/dram -> d/cnic{i}_read => p/cnic{i}_write -> p/gpu{i}_down  (4b steps 3-5)
    KV out          p/gpu{i}_up -> p/cnic{i}_read => d/cnic{i}_write -> d/dram    (4a steps 5-7)
    H2D on the DE   d/dram -> d/cnic_read -> d/cnic_write -> d/gpu_down        (4a 8-9, 4b 6-7)
    D2H on the DE   d/gpu_up -> d/cnic_read -> d/cnic_write -> d/dram          (§4.1 persistence)
    persist         d/dram -> d/snic_tx -> storage_write

`drop_unbinding=True` leaves out of every path the links that provably never bind (docs/simulator-physics.md
"Links that cannot bind"): a GPU's PCIe link when it is faster than its CNIC, and a storage direction
when all SNICs' same direction together is slower than it. The max-min rates are bit-identical; those
links then carry no bytes, so the driver keeps them (drop off) whenever link records are written (`-o`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dualpath.config.specs import HardwareSpec
from dualpath.sim.links import Link, LinkNetwork

# Margin of the "never binds" proofs against float residue (links_fill.SAT_RTOL is 1e-8): the links
# that dominate must be slower by more than this (relative).
UNBINDING_MARGIN: Final = 1e-6


@dataclass(frozen=True)
class NodeLinks:
    snic_rx: Link
    snic_tx: Link
    dram: Link
    cnic_read: tuple[Link, ...]
    cnic_write: tuple[Link, ...]
    gpu_down: tuple[Link, ...]
    gpu_up: tuple[Link, ...]


class Topology:
    def __init__(
        self,
        net: LinkNetwork,
        hw: HardwareSpec,
        num_nodes: int,
        *,
        record: bool,
        drop_unbinding: bool = False,
    ) -> None:
        g = hw.gpus_per_node
        self.g = g
        self.record = record  # every link keeps its rate record (`Link.utilisation_record`)
        self.links = net.links
        # Per direction, like the NICs (module docstring): reads and persists do not share one link.
        self.storage_read = net.add_link("storage_read", hw.storage_bytes_per_s, record=record)
        self.storage_write = net.add_link("storage_write", hw.storage_bytes_per_s, record=record)
        self.nodes: list[NodeLinks] = []
        for n in range(num_nodes):

            def add(name: str, bw: float, n: int = n) -> Link:
                return net.add_link(f"node{n}/{name}", bw, record=record)

            self.nodes.append(
                NodeLinks(
                    snic_rx=add("snic_rx", hw.snic_bytes_per_s),
                    snic_tx=add("snic_tx", hw.snic_bytes_per_s),
                    dram=add("dram", hw.dram_bytes_per_s),
                    cnic_read=tuple(add(f"cnic{i}_read", hw.cnic_bytes_per_s) for i in range(g)),
                    cnic_write=tuple(add(f"cnic{i}_write", hw.cnic_bytes_per_s) for i in range(g)),
                    gpu_down=tuple(add(f"gpu{i}_down", hw.pcie_bytes_per_s) for i in range(g)),
                    gpu_up=tuple(add(f"gpu{i}_up", hw.pcie_bytes_per_s) for i in range(g)),
                )
            )

        self.dropped: frozenset[Link] = frozenset(unbinding_links(self, hw) if drop_unbinding else ())
        self._cut: dict[tuple[Link, ...], tuple[Link, ...]] = {}
        # Every path once, per kind and engine (or engine pair): a flow's path is a list lookup, not a
        # tuple to build and hash.
        engines = num_nodes * g
        self._engine_paths: list[list[tuple[Link, ...] | None]] = [[None] * engines for _ in range(5)]
        self._pair_paths: list[list[list[tuple[Link, ...]] | None]] = [[None] * engines for _ in range(2)]

    def _path(self, path: tuple[Link, ...]) -> tuple[Link, ...]:
        """`path` less the dropped links (one tuple per distinct path)."""
        if not self.dropped:
            return path
        cut = self._cut.get(path)
        if cut is None:
            cut = self._cut[path] = tuple(link for link in path if link not in self.dropped)
        return cut

    def _at(self, engine: int) -> tuple[NodeLinks, int]:
        return self.nodes[engine // self.g], engine % self.g

    def _one(self, kind: int, index: int, path: tuple[Link, ...]) -> tuple[Link, ...]:
        cut = self._path(path)
        self._engine_paths[kind][index] = cut
        return cut

    def read(self, node: int) -> tuple[Link, ...]:
        path = self._engine_paths[_READ][node]
        if path is None:
            n = self.nodes[node]
            path = self._one(_READ, node, (self.storage_read, n.snic_rx, n.dram))
        return path

    def load_local(self, pe: int) -> tuple[Link, ...]:
        path = self._engine_paths[_LOAD_LOCAL][pe]
        if path is None:
            n, i = self._at(pe)
            path = self._one(_LOAD_LOCAL, pe, (n.dram, n.cnic_read[i], n.cnic_write[i], n.gpu_down[i]))
        return path

    def load_remote(self, de: int, pe: int) -> tuple[Link, ...]:
        return self._pair(_LOAD_REMOTE, de // self.g, pe)

    def kv_out(self, pe: int, de: int) -> tuple[Link, ...]:
        return self._pair(_KV_OUT, pe, de // self.g)

    def _pair(self, kind: int, a: int, b: int) -> tuple[Link, ...]:
        """The path between a PE engine and a DE *node* (the DE buffer is node-wide, module NOTE), kept
        per (DE node, PE engine) for loads and per (PE engine, DE node) for KV out: a DE node's engines
        share their paths, so a row per DE engine would hold each path `g` times, in memory every flow's
        start reads (at 48P96D 768 rows of 384 for loads)."""
        row = self._pair_paths[kind][a]
        if row is None:
            row = self._pair_paths[kind][a] = []
        if b < len(row) and row[b]:
            return row[b]
        if kind == _LOAD_REMOTE:  # a = DE node, b = PE engine
            d = self.nodes[a]
            p, i = self._at(b)
            path = self._path((d.dram, d.cnic_read[i], p.cnic_write[i], p.gpu_down[i]))
        else:  # _KV_OUT: a = PE engine, b = DE node
            p, i = self._at(a)
            d = self.nodes[b]
            path = self._path((p.gpu_up[i], p.cnic_read[i], d.cnic_write[i], d.dram))
        while len(row) <= b:
            row.append(())
        row[b] = path
        return path

    def h2d(self, de: int) -> tuple[Link, ...]:
        path = self._engine_paths[_H2D][de]
        if path is None:
            d, j = self._at(de)
            path = self._one(_H2D, de, (d.dram, d.cnic_read[j], d.cnic_write[j], d.gpu_down[j]))
        return path

    def d2h(self, de: int) -> tuple[Link, ...]:
        path = self._engine_paths[_D2H][de]
        if path is None:
            d, j = self._at(de)
            path = self._one(_D2H, de, (d.gpu_up[j], d.cnic_read[j], d.cnic_write[j], d.dram))
        return path

    def persist(self, de: int) -> tuple[Link, ...]:
        path = self._engine_paths[_PERSIST][de]
        if path is None:
            d, _ = self._at(de)
            path = self._one(_PERSIST, de, (d.dram, d.snic_tx, self.storage_write))
        return path


# `Topology._engine_paths` rows (one path per node or engine) and `_pair_paths` rows (`Topology._pair`).
_READ: Final = 0
_LOAD_LOCAL: Final = 1
_H2D: Final = 2
_D2H: Final = 3
_PERSIST: Final = 4
_LOAD_REMOTE: Final = 0
_KV_OUT: Final = 1


def unbinding_links(topo: Topology, hw: HardwareSpec) -> list[Link]:
    """Links no max-min allocation of these paths ever saturates or freezes at (docs/simulator-physics.md).

    Link B never binds if every path through B also crosses links X whose capacities sum to less than B's
    and that split B's flows (each flow on B crosses exactly one X): then B's load is below its capacity
    and, in progressive filling, some X always offers a strictly smaller fair share than B.
    GPU PCIe links: each crosses its rail CNIC's side (gpu_down -> cnic_write, gpu_up -> cnic_read).
    Storage: each read crosses one node's SNIC rx, each persist one node's SNIC tx.
    """
    out: list[Link] = []
    if hw.cnic_bytes_per_s < hw.pcie_bytes_per_s * (1.0 - UNBINDING_MARGIN):
        for n in topo.nodes:
            out += n.gpu_down + n.gpu_up
    snics_bytes_per_s = len(topo.nodes) * hw.snic_bytes_per_s  # one direction of every SNIC
    if snics_bytes_per_s < hw.storage_bytes_per_s * (1.0 - UNBINDING_MARGIN):
        out += [topo.storage_read, topo.storage_write]
    return out
