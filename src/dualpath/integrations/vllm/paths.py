"""Basic vs DualPath through vLLM on one host: the core of `benchmarks/vllm_paths.py` and
`dualpath demo --engine vllm` (needs the vLLM extra).

Set-up: one in-process vLLM engine with DualPathConnector (the prefill instance; it also decodes, as the PD
hand-off to a separate decode engine is not built), and D decode nodes' DE read services (the code a decode
instance's connector runs, `de_serve_endpoint`), each reading through its own SNIC and writing into the prefill
instance's buffer over shared memory. Every SNIC is emulated at one rate, set low so storage binds.

Workload: agents replay multi-round trajectories offline (all start at once; round r+1 = round r's prompt +
output + a short append). The first round (no hit: it computes and persists each context) is untimed; jct_s
counts the `rounds` hit rounds after it. Each mode runs its own agents (other token seeds, same lengths).

Decisions: `RouterBook`, the code `dualpath route` runs: basic reads every hit on the prefill node; dualpath
picks the read side by ShorterQueue against the decode node with the shorter queue (paper §6.3).

Reported per mode: jct_s, ttft_mean_s, output tokens/s, and per SNIC `snic_utilisation` = bytes read ÷ (rate ×
time the SNIC had reads waiting or in flight, sampled every 5 ms) and `snic_share` = bytes ÷ (rate × jct_s).
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dualpath.integrations.vllm.plan import hit_blocks
from dualpath.integrations.vllm.router_book import Placement, RouterBook

BLOCK_TOKENS = 32
PREFILL = "p0"


@dataclass(frozen=True, kw_only=True)
class PathsOptions:
    agents: int = 8
    rounds: int = 3  # timed rounds after the untimed first one
    context: int = 1200  # first-round prompt tokens
    append: int = 32  # tokens appended per round
    output: int = 2  # generated tokens per round
    decode_nodes: int = 2
    snic_mb_s: float = 4.0  # every emulated SNIC's rate
    load_mode: str = "staged"
    modes: tuple[str, ...] = ("basic", "dualpath")


@dataclass
class ModeResult:
    jct_s: float = 0.0
    ttft_mean_s: float = 0.0
    output_tokens_per_s: float = 0.0
    pe_reads: int = 0
    de_reads: int = 0
    snic_utilisation: dict[str, float] = field(default_factory=dict)
    snic_share: dict[str, float] = field(default_factory=dict)
    snic_waiting_s: dict[str, float] = field(default_factory=dict)
    bytes_read: dict[str, int] = field(default_factory=dict)


@dataclass
class _Agent:
    prompt: list[int]
    appends: list[list[int]]
    round: int = 0
    placement: Placement | None = None
    submitted_s: float = 0.0
    first_token: bool = False
    done_s: float = 0.0


class WaitClock:
    """Seconds during which each SNIC had reads queued or in flight (its read queue non-empty), sampled."""

    PERIOD_S = 0.005

    def __init__(self, snics: dict[str, Any]) -> None:
        self.snics = snics
        self.waiting_s = dict.fromkeys(snics, 0.0)
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


def _agents(options: PathsOptions, seed: int, vocab: int) -> list[_Agent]:
    rng = random.Random(seed)
    tokens = lambda k: [rng.randrange(1, vocab) for _ in range(k)]  # noqa: E731
    return [
        _Agent(
            prompt=tokens(options.context),
            appends=[tokens(options.append) for _ in range(options.rounds + 1)],
        )
        for _ in range(options.agents)
    ]


def run_mode(
    mode: str, llm: Any, snics: dict[str, Any], store: Any, options: PathsOptions, seed: int
) -> ModeResult:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from dualpath.integrations.vllm.tiny_model import VOCAB

    engine = llm.llm_engine
    book = RouterBook(1, [n for n in snics if n != PREFILL], mode=mode, block_tokens=BLOCK_TOKENS)
    agents = _agents(options, seed, VOCAB)
    result = ModeResult()
    ttfts: list[float] = []
    output_tokens = 0

    def submit(i: int) -> None:
        agent = agents[i]
        _, hit = hit_blocks(agent.prompt, BLOCK_TOKENS, lambda k: store.path_of(k).is_file())
        agent.placement = book.place(len(agent.prompt), hit * BLOCK_TOKENS)
        agent.first_token, agent.submitted_s = False, time.monotonic()
        if hit:
            result.de_reads += agent.placement.read_path == "de"
            result.pe_reads += agent.placement.read_path == "pe"
        params = SamplingParams(
            temperature=0.0,
            max_tokens=options.output,
            detokenize=False,
            extra_args={"kv_transfer_params": agent.placement.kv_transfer_params},
        )
        engine.add_request(f"{mode}-{i}-{agent.round}", TokensPrompt(prompt_token_ids=agent.prompt), params)

    def drive(last_round: int) -> None:
        """Run every agent up to `last_round` (inclusive), each submitting its next round when one ends."""
        nonlocal output_tokens
        for i in range(len(agents)):
            submit(i)
        left = len(agents)
        while left:
            for out in engine.step():
                agent = agents[int(out.request_id.split("-")[1])]
                assert agent.placement is not None
                if out.outputs and out.outputs[0].token_ids and not agent.first_token:
                    agent.first_token = True
                    ttfts.append(time.monotonic() - agent.submitted_s)
                    book.loaded(agent.placement)
                if not out.finished:
                    continue
                book.finished(agent.placement, loaded=agent.first_token)
                output_tokens += len(out.outputs[0].token_ids)
                agent.prompt = agent.prompt + list(out.outputs[0].token_ids) + agent.appends[agent.round]
                agent.round += 1
                if agent.round <= last_round:
                    submit(agents.index(agent))
                else:
                    agent.done_s = time.monotonic()
                    left -= 1

    drive(last_round=0)  # the cold round: computes and persists every context, untimed
    ttfts.clear()
    output_tokens = result.de_reads = result.pe_reads = 0
    before = {name: s.rx.stats() for name, s in snics.items()}
    clock = WaitClock(snics)
    start_s = time.monotonic()
    drive(last_round=options.rounds)
    waiting_s = clock.stop()
    result.jct_s = max(a.done_s for a in agents) - start_s
    result.ttft_mean_s = sum(ttfts) / len(ttfts)
    result.output_tokens_per_s = output_tokens / result.jct_s
    for name, snic in snics.items():
        nbytes = snic.rx.stats().total_bytes - before[name].total_bytes
        rate = snic.rx.rate_bytes_per_s
        result.bytes_read[name] = nbytes
        result.snic_waiting_s[name] = waiting_s[name]
        result.snic_utilisation[name] = nbytes / (rate * waiting_s[name]) if waiting_s[name] > 0 else 0.0
        result.snic_share[name] = nbytes / (rate * result.jct_s)
    return result


def run_paths(options: PathsOptions, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start the engine and the DE services, run each mode, return the summary (JSON types)."""
    for name, value in {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }.items():
        os.environ.setdefault(name, value)
    from vllm import LLM
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from dualpath.integrations.vllm.de_service import DeReadService, make_snic
    from dualpath.integrations.vllm.tiny_model import write_tiny_llama
    from dualpath.kvcache import FileStore

    rate = options.snic_mb_s * 1e6
    results: dict[str, ModeResult] = {}
    with tempfile.TemporaryDirectory(prefix="dp-vllm-paths-") as tmp:
        model = write_tiny_llama(Path(tmp) / "model")
        store_dir = Path(tmp) / "store"
        namespace = f"vp{os.getpid()}"
        des = [
            DeReadService(
                endpoint=f"d{i}",
                namespace=namespace,
                store=FileStore(store_dir, 2**34),
                snic=make_snic(f"d{i}", rate),
            )
            for i in range(options.decode_nodes)
        ]
        kv = KVTransferConfig(
            kv_connector="DualPathConnector",
            kv_connector_module_path="dualpath.integrations.vllm",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={
                "store_dir": str(store_dir),
                "snic_bytes_per_s": rate,
                "endpoint": PREFILL,
                "namespace": namespace,
                "persist_wait": True,
                "load_mode": options.load_mode,
                "de_buffer_bytes": 256 * 2**20,
            },
        )
        say(
            f"starting vLLM (tiny random Llama) with DualPathConnector and {options.decode_nodes} DE read services"
        )
        llm = LLM(
            model=str(model),
            skip_tokenizer_init=True,
            enforce_eager=True,
            enable_prefix_caching=False,
            dtype="float32",
            block_size=BLOCK_TOKENS,
            max_model_len=4096,
            max_num_seqs=max(8, options.agents),
            seed=0,
            kv_transfer_config=kv,
        )
        connector = get_kv_transfer_group()
        snics = {PREFILL: connector.snic} | {d.endpoint: d.snic for d in des}
        try:
            for seed, mode in enumerate(options.modes):
                say(f"[{mode}] {options.agents} agents x (1 + {options.rounds}) rounds")
                results[mode] = run_mode(mode, llm, snics, connector.store, options, seed=100 + seed)
        finally:
            for d in des:
                d.close()
    summary: dict[str, Any] = {"setup": asdict(options), "modes": {m: asdict(r) for m, r in results.items()}}
    if "basic" in results and "dualpath" in results:
        summary["basic_over_dualpath_jct"] = results["basic"].jct_s / results["dualpath"].jct_s
    return summary


def mode_table(
    summary: dict[str, Any], *, tokens_per_s_key: str, snic_header: str, snic_share: Callable[[Any], float]
) -> str:
    """One row per mode (JCT, TTFT, tok/s, reads per side, a share per SNIC) and the basic/dualpath ratio:
    the table of this benchmark and of the demo through the router (`cluster_demo`)."""
    lines = [f"{'mode':9s} {'JCT s':>7s} {'TTFT s':>7s} {'tok/s':>7s} {'reads pe/de':>11s}  {snic_header}"]
    for mode, r in summary["modes"].items():
        shares = "  ".join(f"{n} {snic_share(v):4.0%}" for n, v in r["snic"].items())
        lines.append(
            f"{mode:9s} {r['jct_s']:7.2f} {r['ttft_mean_s']:7.2f} {r[tokens_per_s_key]:7.1f} "
            f"{r['pe_reads']:5d}/{r['de_reads']:<5d}  {shares}"
        )
    if "basic_over_dualpath_jct" in summary:
        lines.append(f"basic/dualpath JCT {summary['basic_over_dualpath_jct']:.2f}x")
    return "\n".join(lines)


def format_summary(summary: dict[str, Any]) -> str:
    modes = {m: {**r, "snic": r["snic_utilisation"]} for m, r in summary["modes"].items()}
    return mode_table({**summary, "modes": modes}, tokens_per_s_key="output_tokens_per_s",
                      snic_header="SNIC utilisation", snic_share=float)  # fmt: skip
