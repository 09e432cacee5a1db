"""Basic vs DualPath through vLLM: one vLLM engine with DualPathConnector, storage bound by emulated SNICs.

    python benchmarks/vllm_paths.py --json        # needs the vLLM extra (make vllm); ≈ 1-2 min on 2 cores

Set-up (one host, CPU): a vLLM engine (the prefill instance; it also decodes here, as the PD hand-off to a
separate decode engine is not built) whose connector reads hits through its node's SNIC, and D decode nodes'
DE read services (the code a decode instance's connector runs, `de_serve_endpoint`), each reading through its
own SNIC and writing into the prefill instance's buffer over shared memory. Every SNIC is emulated at the same
rate, set low so storage binds (a tiny model's compute is milliseconds).

Workload: agents replay multi-round trajectories offline (all start at once; round r+1 = round r's prompt +
output + a short append, so rounds ≥ 2 are almost all hit). The first round (no hit: it computes and
persists each agent's context) is untimed; jct_s counts the `--rounds` hit rounds after it. Each mode runs its
own agents (other token seeds, same lengths) on the same engine and store.

    basic     every hit is read by the prefill node's SNIC (the baseline's only path, Fig. 4a)
    dualpath  per request, our policy code (dualpath.policy.read_path.ShorterQueue, paper §6.3) picks the
              prefill node or the decode node with the shorter read queue; a queue holds the hit tokens of
              requests sent to that side whose load has not finished (known when the first token comes)

Reported per mode: jct_s (all timed rounds done), ttft_mean_s, and per SNIC `snic_utilisation` = bytes read ÷
(rate × time the SNIC had reads waiting or in flight, sampled every 5 ms) with `snic_share` = bytes read ÷
(rate × jct_s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

for _name, _value in {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
}.items():
    os.environ.setdefault(_name, _value)

BLOCK_TOKENS = 32


@dataclass
class Agent:
    prompt: list[int]
    appends: list[list[int]]
    round: int = 0
    read_side: str = ""
    hit_tokens: int = 0
    submitted_s: float = 0.0
    first_token: bool = False
    done_s: float = 0.0


class WaitClock:
    """Seconds during which each SNIC had reads queued or in flight (its read queue non-empty), sampled."""

    PERIOD_S = 0.005

    def __init__(self, snics: dict[str, Any]) -> None:
        self.snics = snics
        self.waiting_s = {name: 0.0 for name in snics}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.PERIOD_S):
            now = time.monotonic()
            for name, snic in self.snics.items():
                if snic.read_queue.queued_requests:
                    self.waiting_s[name] += now - last
            last = now

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.waiting_s


@dataclass
class ModeResult:
    jct_s: float
    ttft_mean_s: float
    ttfts_s: list[float] = field(default_factory=list)
    snic_utilisation: dict[str, float] = field(default_factory=dict)
    snic_share: dict[str, float] = field(default_factory=dict)
    snic_waiting_s: dict[str, float] = field(default_factory=dict)
    bytes_read: dict[str, int] = field(default_factory=dict)
    de_reads: int = 0
    pe_reads: int = 0


def make_agents(n: int, rounds: int, context: int, append: int, seed: int, vocab: int) -> list[Agent]:
    rng = random.Random(seed)
    tokens = lambda k: [rng.randrange(1, vocab) for _ in range(k)]  # noqa: E731
    return [
        Agent(prompt=tokens(context), appends=[tokens(append) for _ in range(rounds + 1)]) for _ in range(n)
    ]


def run_mode(
    mode: str, llm: Any, snics: dict[str, Any], store: Any, args: argparse.Namespace, seed: int
) -> ModeResult:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from dualpath.integrations.vllm.plan import hit_blocks
    from dualpath.integrations.vllm.tiny_model import VOCAB
    from dualpath.policy.read_path import ShorterQueue
    from dualpath.policy.types import NodeReadState, ReadSide

    engine = llm.llm_engine
    policy = ShorterQueue()
    kv_bytes_per_token = args.kv_bytes_per_token
    rate_tokens_per_s = args.snic_mb_s * 1e6 / kv_bytes_per_token
    queue_tokens = {name: 0 for name in snics}  # hit tokens sent to a side whose load has not finished
    agents = make_agents(args.agents, args.rounds, args.context, args.append, seed, VOCAB)
    result = ModeResult(jct_s=0.0, ttft_mean_s=0.0)

    def submit(i: int) -> None:
        agent = agents[i]
        _, hit = hit_blocks(agent.prompt, BLOCK_TOKENS, lambda k: store.path_of(k).is_file())
        agent.hit_tokens, agent.first_token, agent.submitted_s = hit * BLOCK_TOKENS, False, time.monotonic()
        side = "pe0"
        if mode == "dualpath" and agent.hit_tokens:
            de = min((n for n in snics if n != "pe0"), key=lambda n: (queue_tokens[n], n))
            plan = policy.plan(
                agent.hit_tokens,
                pe_node=NodeReadState(queue_tokens["pe0"], rate_tokens_per_s),
                de_node=NodeReadState(queue_tokens[de], rate_tokens_per_s),
                block_tokens=BLOCK_TOKENS,
            )
            side = de if plan.side is ReadSide.DE else "pe0"
        agent.read_side = side
        queue_tokens[side] += agent.hit_tokens
        if agent.hit_tokens:
            result.de_reads += side != "pe0"
            result.pe_reads += side == "pe0"
        path = {"read_path": "pe"} if side == "pe0" else {"read_path": "de", "de_endpoint": side}
        params = SamplingParams(
            temperature=0.0,
            max_tokens=args.output,
            detokenize=False,
            extra_args={"kv_transfer_params": {"dualpath": path}},
        )
        engine.add_request(f"{mode}-{i}-{agent.round}", TokensPrompt(prompt_token_ids=agent.prompt), params)

    def drive(last_round: int) -> None:
        """Run every agent up to `last_round` (inclusive), each submitting its next round when one ends."""
        for i in range(len(agents)):
            submit(i)
        left = len(agents)
        while left:
            for out in engine.step():
                i = int(out.request_id.split("-")[1])
                agent = agents[i]
                if out.outputs and out.outputs[0].token_ids and not agent.first_token:
                    agent.first_token = True
                    result.ttfts_s.append(time.monotonic() - agent.submitted_s)
                    queue_tokens[agent.read_side] -= agent.hit_tokens
                if not out.finished:
                    continue
                agent.prompt = agent.prompt + list(out.outputs[0].token_ids) + agent.appends[agent.round]
                agent.round += 1
                if agent.round <= last_round:
                    submit(i)
                else:
                    agent.done_s = time.monotonic()
                    left -= 1

    # The first round has no hit (nothing is stored yet): it computes and persists, untimed.
    drive(last_round=0)
    result.ttfts_s.clear()
    result.de_reads = result.pe_reads = 0
    before = {name: s.rx.stats() for name, s in snics.items()}
    clock = WaitClock(snics)
    start_s = time.monotonic()
    drive(last_round=args.rounds)
    waiting_s = clock.stop()
    result.jct_s = max(a.done_s for a in agents) - start_s
    result.ttft_mean_s = sum(result.ttfts_s) / len(result.ttfts_s)
    for name, snic in snics.items():
        now = snic.rx.stats()
        nbytes = now.total_bytes - before[name].total_bytes
        result.bytes_read[name] = nbytes
        result.snic_waiting_s[name] = waiting_s[name]
        busy = snic.rx.rate_bytes_per_s * waiting_s[name]
        result.snic_utilisation[name] = nbytes / busy if busy > 0 else 0.0
        result.snic_share[name] = nbytes / (snic.rx.rate_bytes_per_s * result.jct_s)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the untimed first one")
    parser.add_argument("--context", type=int, default=1200, help="first-round prompt tokens")
    parser.add_argument("--append", type=int, default=32, help="tokens appended per round")
    parser.add_argument("--output", type=int, default=2, help="generated tokens per round")
    parser.add_argument("--decode-nodes", type=int, default=2)
    parser.add_argument("--snic-mb-s", type=float, default=4.0, help="every emulated SNIC's rate, MB/s")
    parser.add_argument("--load-mode", choices=("staged", "layerwise"), default="staged")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from vllm import LLM
    from vllm.config import KVTransferConfig

    from dualpath.integrations.vllm.de_service import DeReadService, make_snic
    from dualpath.integrations.vllm.tiny_model import write_tiny_llama
    from dualpath.kvcache import FileStore

    rate = args.snic_mb_s * 1e6
    with tempfile.TemporaryDirectory(prefix="dp-vllm-bench-") as tmp:
        model = write_tiny_llama(Path(tmp) / "model")
        store_dir = Path(tmp) / "store"
        namespace = f"vb{os.getpid()}"
        des = [
            DeReadService(
                endpoint=f"d{i}",
                namespace=namespace,
                store=FileStore(store_dir, 2**34),
                snic=make_snic(f"d{i}", rate),
            )
            for i in range(args.decode_nodes)
        ]
        kv = KVTransferConfig(
            kv_connector="DualPathConnector",
            kv_connector_module_path="dualpath.integrations.vllm",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={
                "store_dir": str(store_dir),
                "snic_bytes_per_s": rate,
                "endpoint": "pe0",
                "namespace": namespace,
                "persist_wait": True,
                "load_mode": args.load_mode,
                "de_buffer_bytes": 256 * 2**20,
            },
        )
        llm = LLM(
            model=str(model),
            skip_tokenizer_init=True,
            enforce_eager=True,
            enable_prefix_caching=False,
            dtype="float32",
            block_size=BLOCK_TOKENS,
            max_model_len=4096,
            max_num_seqs=max(8, args.agents),
            seed=0,
            kv_transfer_config=kv,
        )
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        connector = get_kv_transfer_group()
        kv_layers = connector._kv_layers
        args.kv_bytes_per_token = (
            sum(layer[0].numel() * layer.element_size() for layer in kv_layers) // BLOCK_TOKENS
        )
        snics = {"pe0": connector.snic} | {d.endpoint: d.snic for d in des}
        results = {}
        try:
            for seed, mode in enumerate(("basic", "dualpath")):
                results[mode] = run_mode(mode, llm, snics, connector.store, args, seed=100 + seed)
        finally:
            for d in des:
                d.close()
    summary: dict[str, Any] = {
        "setup": {k: v for k, v in vars(args).items() if k != "json"},
        "modes": {m: {k: v for k, v in vars(r).items() if k != "ttfts_s"} for m, r in results.items()},
        "basic_over_dualpath_jct": results["basic"].jct_s / results["dualpath"].jct_s,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    for mode, r in results.items():
        utils = " ".join(f"{n} {u:.0%}" for n, u in r.snic_utilisation.items())
        print(
            f"{mode:9s} jct {r.jct_s:6.2f} s  ttft {r.ttft_mean_s:5.2f} s  reads pe/de {r.pe_reads}/{r.de_reads}  "
            f"SNIC busy-utilisation {utils}"
        )
    print(f"basic/dualpath JCT {summary['basic_over_dualpath_jct']:.2f}x")


if __name__ == "__main__":
    main()
