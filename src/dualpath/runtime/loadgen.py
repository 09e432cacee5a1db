"""The load generator behind `dualpath bench`: agent trajectories replayed as closed-loop HTTP clients.

Replay follows paper A.3: round i+1 sends the whole context A_1 G_1 ... A_i G_i A_{i+1} (G_i = the tokens
the server actually generated, as token ids) and asks for exactly g_{i+1} tokens (`ignore_eos`). Tool time
and inter-round gaps are zero. Offline: all agents start at once; online: Poisson arrivals at `aps` agents
per second from a seeded generator. Append tokens are random ids from the agent's own seeded generator, so
the same seed replays byte-identical prompts.

Two endpoints: `completions` (default) sends the exact token ids; `chat` sends the conversation as
messages (each append a user message of random lowercase text, each reply the assistant's text), as a chat
client would; its token counts come from the server's usage.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np


@dataclass(frozen=True, kw_only=True)
class AgentPlan:
    """One agent: its rounds as (append_tokens, generated_tokens), already scaled, and its start offset."""

    agent_id: int
    rounds: tuple[tuple[int, int], ...]
    start_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RoundRecord:
    """What the client measured for one request (seconds since the bench started)."""

    agent_id: int
    round_index: int
    prompt_tokens: int
    generated_tokens: int
    sent_s: float
    first_token_s: float
    second_token_s: float | None
    done_s: float
    info: dict[str, object] = field(default_factory=dict)
    token_ids: tuple[int, ...] = ()  # the ids served (completions endpoint; chat rounds keep text only)
    request_id: str = ""  # the server's id of the request (its chunks' `id`)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def ttst_s(self) -> float | None:
        return None if self.second_token_s is None else self.second_token_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        if self.generated_tokens < 2:
            return None
        return (self.done_s - self.first_token_s) / (self.generated_tokens - 1)


@dataclass(frozen=True, kw_only=True)
class AgentRecord:
    agent_id: int
    start_s: float
    end_s: float

    @property
    def jct_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    rounds: tuple[RoundRecord, ...]
    agents: tuple[AgentRecord, ...]
    wall_s: float
    started_monotonic_s: float = 0.0  # `time.monotonic()` at the bench's t0: the records' times count from it


def scale_tokens(tokens: int, context_scale: float) -> int:
    """Token counts of the 64K traces scaled for the tiny model: round(tokens x scale), min 1."""
    return max(1, round(tokens * context_scale))


def poisson_starts(n: int, aps: float | None, rng: np.random.Generator) -> list[float]:
    """Offline (aps None): everyone at 0. Online: cumulative exponential gaps with mean 1/aps."""
    if aps is None:
        return [0.0] * n
    return [float(t) for t in np.cumsum(rng.exponential(1.0 / aps, size=n))]


ENDPOINTS = ("completions", "chat")
_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)


async def _stream_events(client: httpx.AsyncClient, path: str, body: dict) -> AsyncIterator[dict]:
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"server answered {response.status_code}: {(await response.aread()).decode()[:300]}"
            )
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[len("data: ") :])


async def _post_round(
    client: httpx.AsyncClient, prompt: list[int], max_tokens: int, t0: float, model: str | None
) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0}
    if model is not None:
        body["model"] = model
    sent = time.monotonic() - t0
    times: list[float] = []
    token_ids: list[int] = []
    info: dict[str, object] = {}
    request_id = ""
    async for event in _stream_events(client, "/v1/completions", body):
        if not event.get("choices"):
            continue
        ids = event["choices"][0]["token_ids"]
        now = time.monotonic() - t0
        times.extend([now] * len(ids))
        token_ids.extend(ids)
        info = event.get("dualpath", info)
        request_id = event.get("id", "")
    return {"sent": sent, "times": times, "token_ids": token_ids, "info": info, "prompt_tokens": len(prompt),
            "request_id": request_id}  # fmt: skip


async def _post_chat_round(
    client: httpx.AsyncClient, messages: list[dict[str, str]], max_tokens: int, t0: float, model: str | None
) -> dict:
    """One chat round; a chunk with content counts as one token's arrival, the counts come from usage."""
    body = {
        "messages": messages,
        "max_completion_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
    }
    if model is not None:
        body["model"] = model
    sent = time.monotonic() - t0
    times: list[float] = []
    text: list[str] = []
    info: dict[str, object] = {}
    usage: dict[str, int] = {}
    async for event in _stream_events(client, "/v1/chat/completions", body):
        usage = event.get("usage") or usage
        info = event.get("dualpath", info)
        for choice in event.get("choices", []):
            if content := (choice.get("delta") or {}).get("content"):
                times.append(time.monotonic() - t0)
                text.append(content)
    return {
        "sent": sent,
        "times": times,
        "text": "".join(text),
        "info": info,
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "generated_tokens": int(usage.get("completion_tokens", len(times))),
    }


def _record(plan: AgentPlan, index: int, out: dict, generated_tokens: int) -> RoundRecord:
    times = out["times"]
    return RoundRecord(
        agent_id=plan.agent_id,
        round_index=index,
        prompt_tokens=out["prompt_tokens"],
        generated_tokens=generated_tokens,
        sent_s=out["sent"],
        first_token_s=times[0] if times else out["sent"],
        second_token_s=times[1] if len(times) > 1 else None,
        done_s=times[-1] if times else out["sent"],
        info=out["info"],
        token_ids=tuple(out.get("token_ids", ())),
        request_id=str(out.get("request_id", "")),
    )


async def _run_agent(
    client: httpx.AsyncClient,
    plan: AgentPlan,
    *,
    vocab_size: int,
    seed: int,
    t0: float,
    on_round: Callable[[RoundRecord], None],
    endpoint: str = "completions",
    model: str | None = None,
) -> AgentRecord:
    rng = np.random.default_rng([seed, plan.agent_id])
    await asyncio.sleep(max(0.0, plan.start_s - (time.monotonic() - t0)))
    start = time.monotonic() - t0
    context: list[int] = []
    messages: list[dict[str, str]] = []
    for index, (append_tokens, gen_tokens) in enumerate(plan.rounds):
        if endpoint == "chat":
            messages.append({"role": "user", "content": _random_text(rng, append_tokens)})
            out = await _post_chat_round(client, messages, gen_tokens, t0, model)
            on_round(_record(plan, index, out, out["generated_tokens"]))
            messages.append({"role": "assistant", "content": out["text"]})
            continue
        context.extend(int(t) for t in rng.integers(0, vocab_size, size=append_tokens))
        out = await _post_round(client, context, gen_tokens, t0, model)
        on_round(_record(plan, index, out, len(out["token_ids"])))
        context.extend(out["token_ids"])
    return AgentRecord(agent_id=plan.agent_id, start_s=start, end_s=time.monotonic() - t0)


def _random_text(rng: np.random.Generator, chars: int) -> str:
    """Lowercase letters and spaces: one token per character for a byte tokenizer."""
    return bytes(_LETTERS[rng.integers(0, len(_LETTERS), size=chars)]).decode()


async def run_bench(
    url: str,
    plans: Sequence[AgentPlan],
    *,
    vocab_size: int,
    seed: int = 0,
    progress: bool = True,
    timeout_s: float = 600.0,
    transport: httpx.AsyncBaseTransport | None = None,
    endpoint: str = "completions",
    model: str | None = None,
) -> BenchResult:
    """Replay every agent against the server at `url`; one progress-bar tick per finished round."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    from tqdm import tqdm

    records: list[RoundRecord] = []
    total = sum(len(p.rounds) for p in plans)
    bar = tqdm(total=total, desc="rounds", unit="req", disable=not progress, leave=False)

    def on_round(record: RoundRecord) -> None:
        records.append(record)
        bar.update(1)

    limits = httpx.Limits(max_connections=len(plans) + 4, max_keepalive_connections=len(plans) + 4)
    async with httpx.AsyncClient(
        base_url=url, timeout=timeout_s, limits=limits, transport=transport
    ) as client:
        t0 = time.monotonic()
        agents = await asyncio.gather(
            *(
                _run_agent(
                    client,
                    p,
                    vocab_size=vocab_size,
                    seed=seed,
                    t0=t0,
                    on_round=on_round,
                    endpoint=endpoint,
                    model=model,
                )
                for p in plans
            )
        )
        wall = time.monotonic() - t0
    bar.close()
    records.sort(key=lambda r: (r.agent_id, r.round_index))
    return BenchResult(
        rounds=tuple(records),
        agents=tuple(sorted(agents, key=lambda a: a.agent_id)),
        wall_s=wall,
        started_monotonic_s=t0,
    )


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarise(result: BenchResult) -> dict[str, object]:
    """JCT (makespan and per agent), TTFT/TTST/TPOT percentiles and token throughput."""
    generated = sum(r.generated_tokens for r in result.rounds)
    jcts = [a.jct_s for a in result.agents]
    # Each agent's first round: with an empty store it reads nothing (`benchmarks/runtime_paths.py` reports
    # its share of the JCT: the rounds that can read have the rest)
    first = [r.done_s - r.sent_s for r in result.rounds if r.round_index == 0]
    return {
        "agents": len(result.agents),
        "requests": len(result.rounds),
        "jct_s": max((a.end_s for a in result.agents), default=0.0),  # offline JCT: the last agent's finish
        "agent_jct_s": _percentiles(jcts),
        "ttft_s": _percentiles([r.ttft_s for r in result.rounds]),
        "ttst_s": _percentiles([t for r in result.rounds if (t := r.ttst_s) is not None]),
        "tpot_s": _percentiles([t for r in result.rounds if (t := r.tpot_s) is not None]),
        "generated_tokens": generated,
        "prompt_tokens": sum(r.prompt_tokens for r in result.rounds),
        "tokens_per_s": generated / result.wall_s if result.wall_s > 0 else 0.0,
        "wall_s": result.wall_s,
        "first_round_mean_s": sum(first) / len(first) if first else 0.0,
    }
