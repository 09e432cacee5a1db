"""Hops of the KV movements: the DE buffer is reached through the PE GPU's rail CNIC on the DE node."""

from __future__ import annotations

from dualpath.config.loader import load_cluster
from dualpath.sim.kernel import Simulator
from dualpath.sim.links import LinkNetwork
from dualpath.sim.topology import Topology


def load_hardware(name: str):  # type: ignore[no-untyped-def]
    return load_cluster(
        hardware=name, model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1, overrides=[]
    ).hardware


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


def all_paths(topo: Topology, p: int, d: int, g: int) -> list[tuple]:  # type: ignore[type-arg]
    pes, des = range(p * g), range(p * g, (p + d) * g)
    out = [topo.read(n) for n in range(p + d)]
    out += [topo.load_local(pe) for pe in pes] + [topo.persist(de) for de in des]
    out += [topo.h2d(de) for de in des] + [topo.d2h(de) + topo.persist(de)[1:] for de in des]
    out += [topo.load_remote(de, pe) for de in des for pe in pes] + [
        topo.kv_out(pe, de) for pe in pes for de in des
    ]
    return out


def test_dropped_links_are_the_provably_unbinding_ones_and_keep_paths_distinct() -> None:
    hw = load_hardware("hopper-8x400g")
    full = Topology(LinkNetwork(Simulator()), hw, 6, record=False)
    cut = Topology(LinkNetwork(Simulator()), hw, 6, record=False, drop_unbinding=True)
    assert not full.dropped
    dropped = {link.name for link in cut.dropped}
    assert (
        {"storage_read", "storage_write"} <= dropped
        and "node0/gpu3_down" in dropped
        and "node5/gpu7_up" in dropped
    )
    assert not any("cnic" in n or "snic" in n or "dram" in n for n in dropped)
    paths_full, paths_cut = all_paths(full, 2, 4, 8), all_paths(cut, 2, 4, 8)
    # Distinct paths stay distinct (no two flow groups merge) and every path keeps a link.
    assert len({tuple(names(p)) for p in paths_cut}) == len({tuple(names(p)) for p in paths_full})
    assert all(paths_cut)
    # Each dropped link's flows all cross a dominating link: its rail CNIC side, or one SNIC direction.
    for full_path in paths_full:
        for link in full_path:
            if link.name.endswith("_down"):
                assert any(
                    x.name == link.name.replace("gpu", "cnic").replace("_down", "_write") for x in full_path
                )
            if link.name.endswith("_up"):
                assert any(
                    x.name == link.name.replace("gpu", "cnic").replace("_up", "_read") for x in full_path
                )
            if link.name == "storage_read":
                assert [x.name for x in full_path if "snic" in x.name] == [full_path[1].name]
                assert full_path[1].name.endswith("snic_rx")
            if link.name == "storage_write":
                assert [x.name for x in full_path if "snic" in x.name] == [full_path[-2].name]
                assert full_path[-2].name.endswith("snic_tx")


def test_storage_stays_only_when_one_direction_of_the_snics_could_fill_it() -> None:
    hw = load_hardware("hopper-8x400g")  # 6.6 TiB/s per direction; 145 nodes x 50 GB/s stay below it
    paper_48p96d = Topology(LinkNetwork(Simulator()), hw, 144, record=False, drop_unbinding=True)
    assert {paper_48p96d.storage_read, paper_48p96d.storage_write} <= paper_48p96d.dropped
    topo = Topology(LinkNetwork(Simulator()), hw, 146, record=False, drop_unbinding=True)
    assert topo.storage_read not in topo.dropped and topo.storage_write not in topo.dropped
    assert topo.nodes[0].gpu_down[0] in topo.dropped


def test_dropping_unbinding_links_changes_no_result() -> None:
    from dualpath.sim.agents import load_trajectories
    from dualpath.sim.driver import SimConfig, Simulation
    from dualpath.sim.summary import summarise

    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=[])  # fmt: skip
    trajectories = [t[:8] for t in load_trajectories("64k", 12, 3)]
    out = {}
    for record in (False, True):  # record_links keeps every link in the paths
        sim = Simulation(
            SimConfig(cluster=cluster, mode="dualpath", record_links=record), trajectories, seed=3
        )
        assert bool(sim.topo.dropped) is not record
        summary = summarise(sim.run(), offline=True, wall_s=0.0)
        # (recording also samples queues once a second, which moves the end of the event loop and gives
        # `read_waits`)
        skip = ("sim_wall_s", "events", "sim_end_s", "read_waits", "link_utilisation")
        out[record] = {k: v for k, v in summary.items() if k not in skip}
    assert out[False] == out[True]


def test_link_summary_changes_no_result_and_matches_the_link_csv(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import csv

    from dualpath.sim.agents import load_trajectories
    from dualpath.sim.driver import SimConfig, Simulation
    from dualpath.sim.summary import summarise, write_outputs

    cluster = load_cluster(hardware="hopper-8x400g", model="ds-27b", num_prefill_nodes=1, num_decode_nodes=1,
                           overrides=[])  # fmt: skip
    trajectories = [t[:8] for t in load_trajectories("64k", 12, 3)]
    runs = {}
    for summary_on in (False, True):
        sim = Simulation(SimConfig(cluster=cluster, mode="dualpath", link_summary=summary_on), trajectories,
                         seed=3)  # fmt: skip
        outcome = sim.run()
        runs[summary_on] = (outcome, summarise(outcome, offline=True, wall_s=0.0))
    plain, with_links = runs[False][1], runs[True][1]
    assert "link_utilisation" not in plain
    utilisation = with_links.pop("link_utilisation")
    plain.pop("sim_wall_s"), with_links.pop("sim_wall_s")
    assert plain == with_links  # every link kept, no queue samples: the same events and numbers
    # The same numbers as the `-o` files' links.csv, per link: mean rate / capacity, bins at >= 95 %.
    outcome = runs[True][0]
    write_outputs(outcome, dict(with_links), {}, tmp_path)
    with (tmp_path / "links.csv").open() as f:
        rows = list(csv.DictReader(f))
    links = outcome.topology_links()
    assert set(utilisation) == set(links)
    for name, (mean, busy) in utilisation.items():
        rates = [float(row[f"{name}_bytes_per_s"]) for row in rows]
        cap = links[name].capacity_bytes_per_s
        assert mean == sum(rates) / len(rates) / cap
        assert busy == sum(r >= 0.95 * cap for r in rates) / len(rates)
    assert max(mean for mean, _ in utilisation.values()) > 0.1
