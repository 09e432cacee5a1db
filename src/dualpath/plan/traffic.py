"""Per-link, per-direction steady-state traffic of DualPath's two read paths (paper §4.2, Fig. 4).

NOTE: the model. Every node's SNIC reads hit KV at its full rate sB (storage "fully used and spread
evenly", §4.2): P·sB enters through PE SNICs and goes the PE read path, D·sB through DE SNICs and
goes the DE read path. Load is balanced over the g GPUs (and CNICs) of each node and over all
(PE, DE) pairs. Miss-token KV, collectives and decode write-back are neglected, as in §4.2.
Step names follow Fig. 4: a3 = step 3 of the PE read path (4a), b5 = step 5 of the DE read path (4b).

    PE read path, per PE node (sB):                DE read path, per DE node (sB):
    a1-2  storage -> PE SNIC -> PE DRAM            b1-2  storage -> DE SNIC -> DE DRAM
    a3-4  PE DRAM -> PE CNIC -> PE HBM (loopback)  b3-5  DE DRAM -> DE CNIC => PE CNIC -> PE HBM
    a5-7  PE HBM -> PE CNIC => DE CNIC -> DE DRAM  b6-7  DE DRAM -> DE CNIC -> DE HBM (one-shot H2D)
    a8-9  DE DRAM -> DE CNIC -> DE HBM

A CNIC "read" is data it DMA-reads over PCIe (and sends), a "write" is data it DMA-writes. Each
PE node's sB of PE-path KV fans out over D DE nodes, so a DE node receives (P/D)·sB of it; a PE node
receives (D/P)·sB of DE-path KV. Every load is therefore k0 + k1·(P/D) + k2·(D/P), with r = P/D:

    link            per                  steps        load                 paper eq.
    PE CNIC read    GPU                  a3 a5        2·sB/g               (1)
    PE CNIC write   GPU                  a4 b5        (sB/g)(1 + 1/r)      (3)
    DE CNIC read    GPU                  a8 b3 b6     (sB/g)(r + 2)        (5)
    DE CNIC write   GPU                  a7 a9 b7     (sB/g)(2r + 1)       (7)
    PE DRAM         node, read+write     a2 a3        2·sB                 -
    DE DRAM         node, read+write     b2 b3 b6 a7 a8  (3 + 2r)·sB       (8)
    PE/DE SNIC read node                 a1 / b1      sB                   -

Coefficients are exact `Fraction`s so the worked example's bounds come out as 1/7 and 7/2 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dualpath.config.specs import HardwareSpec


@dataclass(frozen=True, kw_only=True)
class LinkLoad:
    """Traffic on one link in one direction as a function of r = P/D: k0 + k1·r + k2/r bytes/s."""

    link_id: str  # e.g. "de_cnic_write"
    label: str  # e.g. "DE CNIC write"
    scope: str  # "per GPU" or "per node"
    steps: str  # Fig. 4 steps that load it, e.g. "a7 a9 b7"
    capacity_bytes_per_s: Fraction
    constant_bytes_per_s: Fraction  # k0
    per_pd_ratio_bytes_per_s: Fraction  # k1, multiplies P/D
    per_dp_ratio_bytes_per_s: Fraction  # k2, multiplies D/P
    paper_equation: str = ""

    def bytes_per_s(self, num_prefill_nodes: int, num_decode_nodes: int) -> Fraction:
        r = Fraction(num_prefill_nodes, num_decode_nodes)
        return (
            self.constant_bytes_per_s + self.per_pd_ratio_bytes_per_s * r + self.per_dp_ratio_bytes_per_s / r
        )

    def utilisation(self, num_prefill_nodes: int, num_decode_nodes: int) -> Fraction:
        return self.bytes_per_s(num_prefill_nodes, num_decode_nodes) / self.capacity_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class Hop:
    """One numbered step of Fig. 4: which read path moves the bytes, and which links it loads."""

    step: str  # "a3", "b5", ...
    path: str  # "pe_read" (Fig. 4a) or "de_read" (Fig. 4b)
    link_ids: tuple[str, ...]


# Fig. 4, hop by hop. A PE-path byte is read on a PE node and relayed to a DE node; a DE-path byte
# is read on a DE node and lent to a PE node. Each hop loads the links of the node it happens on.
HOPS = (
    Hop(step="a1", path="pe_read", link_ids=("pe_snic_read",)),
    Hop(step="a2", path="pe_read", link_ids=("pe_dram",)),  # SNIC writes the PE buffer
    Hop(step="a3", path="pe_read", link_ids=("pe_dram", "pe_cnic_read")),  # CNIC reads the buffer
    Hop(step="a4", path="pe_read", link_ids=("pe_cnic_write",)),  # loopback write into PE HBM
    Hop(step="a5", path="pe_read", link_ids=("pe_cnic_read",)),  # CNIC reads PE HBM
    Hop(step="a7", path="pe_read", link_ids=("de_cnic_write", "de_dram")),  # into the DE buffer
    Hop(step="a8", path="pe_read", link_ids=("de_dram", "de_cnic_read")),  # one-shot H2D: read
    Hop(step="a9", path="pe_read", link_ids=("de_cnic_write",)),  # one-shot H2D: write DE HBM
    Hop(step="b1", path="de_read", link_ids=("de_snic_read",)),
    Hop(step="b2", path="de_read", link_ids=("de_dram",)),  # SNIC writes the DE buffer
    Hop(step="b3", path="de_read", link_ids=("de_dram", "de_cnic_read")),  # CNIC reads the buffer
    Hop(step="b5", path="de_read", link_ids=("pe_cnic_write",)),  # into PE HBM
    Hop(step="b6", path="de_read", link_ids=("de_dram", "de_cnic_read")),  # one-shot H2D: read
    Hop(step="b7", path="de_read", link_ids=("de_cnic_write",)),  # one-shot H2D: write DE HBM
)

# link_id -> (label, per-GPU?, paper equation)
LINKS = {
    "pe_snic_read": ("PE SNIC read", False, ""),
    "de_snic_read": ("DE SNIC read", False, ""),
    "pe_cnic_read": ("PE CNIC read", True, "(1)"),
    "pe_cnic_write": ("PE CNIC write", True, "(3)"),
    "de_cnic_read": ("DE CNIC read", True, "(5)"),
    "de_cnic_write": ("DE CNIC write", True, "(7)"),
    "pe_dram": ("PE DRAM", False, ""),
    "de_dram": ("DE DRAM", False, "(8)"),
}


def link_loads(hw: HardwareSpec) -> list[LinkLoad]:
    """The §4.2 traffic table for one node kind, summed hop by hop over `HOPS`."""
    sb = Fraction(hw.snic_bytes_per_s)  # node SNIC bandwidth, the paper's sB
    # A CNIC's traffic crosses its PCIe port too (§4.2 counts PCIe-side traffic), so the tighter binds.
    cnic = min(Fraction(hw.cnic_bytes_per_s), Fraction(hw.pcie_bytes_per_s))
    capacity = {"snic": sb, "cnic": cnic, "dram": Fraction(hw.dram_bytes_per_s)}
    loads = []
    for link_id, (label, per_gpu, equation) in LINKS.items():
        coeffs = [Fraction(0), Fraction(0), Fraction(0)]  # k0, k1 (× P/D), k2 (× D/P)
        hops = [h for h in HOPS if link_id in h.link_ids]
        for hop in hops:
            coeffs[_coefficient_index(hop.path, link_id)] += sb / (hw.gpus_per_node if per_gpu else 1)
        loads.append(
            LinkLoad(
                link_id=link_id,
                label=label,
                scope="per GPU" if per_gpu else "per node",
                steps=" ".join(h.step for h in hops),
                capacity_bytes_per_s=capacity[link_id.split("_")[1]],
                constant_bytes_per_s=coeffs[0],
                per_pd_ratio_bytes_per_s=coeffs[1],
                per_dp_ratio_bytes_per_s=coeffs[2],
                paper_equation=equation,
            )
        )
    return loads


def _coefficient_index(path: str, link_id: str) -> int:
    """Bytes of a path seen per node of a side: sB on the reading side, sB·P/D or sB·D/P across.

    The P·sB of PE-path KV lands on D DE nodes (P/D each); the D·sB of DE-path KV on P PE nodes.
    """
    reading_side = "pe" if path == "pe_read" else "de"
    if link_id.startswith(reading_side):
        return 0
    return 1 if path == "pe_read" else 2
