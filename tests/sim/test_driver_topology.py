"""Hops of the KV movements: the DE buffer is reached through the PE GPU's rail CNIC on the DE node."""

from __future__ import annotations

from dualpath.config.loader import load_cluster
from dualpath.sim.kernel import Simulator
from dualpath.sim.links import LinkNetwork
from dualpath.sim.topology import Topology


def names(path: tuple) -> list[str]:  # type: ignore[type-arg]
    return [link.name for link in path]


def test_buffer_traffic_uses_the_rail_cnic_and_h2d_the_gpus_own() -> None:
    hw = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                      overrides=[]).hardware  # fmt: skip
    topo = Topology(LinkNetwork(Simulator()), hw, 2, record=False)
    pe, de = 3, 8 + 5  # PE GPU 3 on node 0, DE GPU 5 on node 1
    assert names(topo.kv_out(pe, de)) == [
        "node0/gpu3_up",
        "node0/cnic3_read",
        "node1/cnic3_write",
        "node1/dram",
    ]
    assert names(topo.load_remote(de, pe)) == [
        "node1/dram",
        "node1/cnic3_read",
        "node0/cnic3_write",
        "node0/gpu3_down",
    ]
    # Every DE GPU of a node shares the PE GPU's path to that node's buffer: one flow group per step.
    assert topo.kv_out(pe, 8) == topo.kv_out(pe, 15)
    assert names(topo.h2d(de)) == ["node1/dram", "node1/cnic5_read", "node1/cnic5_write", "node1/gpu5_down"]
