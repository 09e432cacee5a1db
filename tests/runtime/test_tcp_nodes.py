"""A PE and a DE as separate processes that talk only over TCP (control plane and KV), as across hosts."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
from runtime_helpers import agent_rounds

from dualpath.runtime.cluster import dump_cluster, load_cluster
from dualpath.runtime.launcher import free_port, stop_process, wait_healthy


def test_prefill_and_decode_nodes_joined_over_tcp_serve_the_reference_tokens(tmp_path, reference):
    spec = replace(
        load_cluster("local-1p2d"),
        num_decode_nodes=1,
        mode="dualpath-rr",
        snic_bytes_per_s=400e6,
        cnic_bytes_per_s=3200e6,
    )
    config = tmp_path / "1p1d.toml"
    config.write_text(dump_cluster(spec))
    store = tmp_path / "store"
    http_port, control_port = free_port(), free_port()
    dualpath = [sys.executable, "-m", "dualpath.cli.main"]
    serve = [*dualpath, "serve", "--config", str(config), "--port", str(http_port), "--store", str(store)]
    serve += ["--no-spawn", "--control-port", str(control_port)]
    processes = [subprocess.Popen(serve)]
    try:
        for role in ("prefill", "decode"):
            node = [*dualpath, "node", "--role", role, "--scheduler", f"tcp://127.0.0.1:{control_port}"]
            node += ["--config", str(config), "--store", str(store), "--tcp-host", "127.0.0.1"]
            processes.append(subprocess.Popen(node))
        url = f"http://127.0.0.1:{http_port}"
        wait_healthy(url, 180, processes[0])
        rounds = agent_rounds(reference, np.random.default_rng(5), rounds=4, append=30, gen=5, url=url)
    finally:
        codes = [stop_process(p) for p in reversed(processes)]
    for prompt, tokens, _ in rounds:
        assert tokens == reference.generate(prompt, len(tokens))
    assert {info["read_side"] for _, _, info in rounds} == {"none", "pe_read", "de_read"}
    assert codes == [0, 0, 0]
