"""`dualpath demo --engine vllm --servers`: 1 prefill + 2 decode `vllm serve` processes, `dualpath route` in
front, and the agentic trace that `dualpath bench` replays, in basic and dualpath (needs the vLLM extra).

    p0  prefill instance: reads hits through its SNIC (PE read path), hands each request to a decode instance
    e0, e1  decode instances: take the hand-off (pd.py) and decode; serve DE reads as d0, d1 through their SNICs
    router (in this process): prefill instance by Algorithm 1, read side by ShorterQueue, decode instance by
            choose_decode_engine (basic: PE read path only)

Every SNIC is emulated at one low rate, so storage binds. The servers start once; each mode replays its own
agents (another trace seed: no hits across modes) and reads the SNIC counters each instance writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from dualpath.integrations.vllm.paths import mode_table
from dualpath.integrations.vllm.router import Router, RouterConfig, make_app
from dualpath.integrations.vllm.servers import vllm_server
from dualpath.integrations.vllm.tiny_model import VOCAB, write_tiny_llama

BLOCK_TOKENS = 32


@dataclass(frozen=True, kw_only=True)
class ClusterDemoOptions:
    agents: int = 8
    rounds: int = 5
    snic_mb_s: float = 1.0  # low: the trace's hits (≈ 2 KB of KV per token) must bind, not the CPU
    modes: tuple[str, ...] = ("basic", "dualpath")


def _snic(stats_dir: Path) -> dict[str, dict[str, float]]:
    out = {}
    for path in sorted(stats_dir.glob("*.json")):
        with contextlib.suppress(ValueError, OSError):
            out[path.stem] = json.loads(path.read_text())
    return out


def run_cluster_demo(
    options: ClusterDemoOptions, say: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    from dualpath.runtime.bench import BenchOptions, make_plans
    from dualpath.runtime.loadgen import run_bench, summarise

    rate = options.snic_mb_s * 1e6
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dp-vllm-cluster-") as tmp_name:
        tmp = Path(tmp_name)
        model = write_tiny_llama(tmp / "model")
        store_dir, stats_dir = tmp / "store", tmp / "snic"
        stats_dir.mkdir()
        namespace = f"vc{os.getpid()}"

        def extra(name: str, **more: Any) -> dict[str, Any]:
            return {
                "store_dir": str(store_dir),
                "endpoint": name,
                "namespace": namespace,
                "snic_bytes_per_s": rate,
                "persist_wait": True,
                "stats_file": str(stats_dir / f"{name}.json"),
                "de_buffer_bytes": 128 * 2**20,
            } | more

        say("starting p0, e0, e1 (vllm serve with DualPathConnector; a minute or more each on 2 cores)")
        args = {"max_model_len": 4096, "max_num_seqs": 16}
        with (
            vllm_server(model, extra("p0"), tmp / "p0.log", **args) as p0,
            vllm_server(model, extra("e0", de_serve_endpoint="d0"), tmp / "e0.log", **args) as e0,
            vllm_server(model, extra("e1", de_serve_endpoint="d1"), tmp / "e1.log", **args) as e1,
        ):
            for seed, mode in enumerate(options.modes):
                router = Router(
                    RouterConfig(
                        prefill_urls=(p0,),
                        prefill_endpoints=("p0",),
                        decode_urls=(e0, e1),
                        de_endpoints=("d0", "d1"),
                        store_dir=str(store_dir),
                        full_block_tokens=BLOCK_TOKENS,
                        mode=mode,
                    ),
                    client=httpx.AsyncClient(timeout=600),
                )
                plans = make_plans(
                    BenchOptions(agents=options.agents, max_rounds=options.rounds, seed=10 + seed)
                )
                say(f"[{mode}] {options.agents} agents x {options.rounds} rounds of the 64k trace (x 1/32)")
                time.sleep(1.0)  # the counters files are rewritten twice a second
                before = _snic(stats_dir)

                async def replay(router: Router = router, plans: Any = plans, seed: int = seed) -> Any:
                    try:
                        return await run_bench(
                            "http://router",
                            plans,
                            vocab_size=VOCAB,
                            seed=10 + seed,
                            progress=False,
                            transport=httpx.ASGITransport(app=make_app(router)),
                            model=str(model),
                        )
                    finally:
                        await router.client.aclose()  # on the loop that opened its connections

                result = asyncio.run(replay())
                time.sleep(1.0)
                after = _snic(stats_dir)
                summary = summarise(result)
                jct = float(summary["jct_s"])  # type: ignore[arg-type]
                snic = {}
                for name, now in after.items():
                    then = before.get(name, {"rx_bytes": 0, "rx_busy_s": 0.0})
                    nbytes = now["rx_bytes"] - then["rx_bytes"]
                    busy = now["rx_busy_s"] - then["rx_busy_s"]
                    snic[name] = {
                        "bytes_read": nbytes,
                        "utilisation_busy": nbytes / (rate * busy) if busy > 0 else 0.0,
                        "share_of_jct": nbytes / (rate * jct) if jct > 0 else 0.0,
                    }
                stats = router.stats()
                results[mode] = {
                    "jct_s": jct,
                    "ttft_mean_s": summary["ttft_s"]["mean"],  # type: ignore[index]
                    "tokens_per_s": summary["tokens_per_s"],
                    "requests": summary["requests"],
                    "pe_reads": stats["pe_reads"],
                    "de_reads": stats["de_reads"],
                    "snic": snic,
                }
    out: dict[str, Any] = {"setup": asdict(options), "modes": results}
    if "basic" in results and "dualpath" in results:
        out["basic_over_dualpath_jct"] = results["basic"]["jct_s"] / results["dualpath"]["jct_s"]
    return out


def format_cluster_summary(summary: dict[str, Any]) -> str:
    return mode_table(summary, tokens_per_s_key="tokens_per_s", snic_header="SNIC share of JCT",
                      snic_share=lambda v: float(v["share_of_jct"]))  # fmt: skip
