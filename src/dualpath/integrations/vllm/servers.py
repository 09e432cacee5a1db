"""Start `vllm serve` processes with DualPathConnector (tests and the cluster demo; CPU build here)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from dualpath.integrations.vllm.config import ConnectorConfig
from dualpath.transfer.shm_backend import default_ipc_address

SERVER_START_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def vllm_server(
    model_dir: Path,
    kv_extra: dict[str, Any],
    log_path: Path,
    *,
    block_tokens: int = 32,
    max_model_len: int = 1024,
    max_num_seqs: int = 4,
) -> Iterator[str]:
    """A `vllm serve` process with DualPathConnector; yields its base URL once /health answers, stops it after."""
    config = ConnectorConfig.from_extra(kv_extra)  # a bad extra config fails here, before a server starts
    kv = {
        "kv_connector": "DualPathConnector",
        "kv_connector_module_path": "dualpath.integrations.vllm",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": kv_extra,
    }
    port = free_port()
    # fmt: off
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--skip-tokenizer-init", "--enforce-eager", "--no-enable-prefix-caching", "--dtype", "float32",
        "--block-size", str(block_tokens), "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs), "--seed", "0", "--disable-log-stats",
        "--host", "127.0.0.1", "--port", str(port), "--kv-transfer-config", json.dumps(kv),
    ]
    # fmt: on
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ | env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + SERVER_START_S
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the vLLM server exited; see {log_path}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the vLLM server did not start in {SERVER_START_S} s; see {log_path}")
                time.sleep(1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _remove_notice_sockets(config)


def _remove_notice_sockets(config: ConnectorConfig) -> None:
    """The ipc socket files of the stopped server's endpoints: vLLM's shutdown on SIGTERM does not close
    the connector, so its endpoints never unlink them (shared-memory transport only; tcp has none)."""
    if config.transport != "shm":
        return
    for endpoint in (config.endpoint, config.de_serve_endpoint):
        if endpoint:
            address = default_ipc_address(config.namespace, endpoint)
            Path(address.removeprefix("ipc://")).unlink(missing_ok=True)
