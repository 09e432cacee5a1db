import asyncio

import httpx
import numpy as np

from dualpath.runtime.api import build_app
from dualpath.runtime.loadgen import AgentPlan, poisson_starts, run_bench, scale_tokens, summarise


def test_scaling_keeps_at_least_one_token():
    assert scale_tokens(429, 1 / 32) == 13
    assert scale_tokens(3, 1 / 32) == 1


def test_online_arrivals_are_seeded_poisson_and_offline_starts_together():
    a = poisson_starts(50, 2.0, np.random.default_rng(1))
    assert a == poisson_starts(50, 2.0, np.random.default_rng(1))
    assert a != poisson_starts(50, 2.0, np.random.default_rng(2))
    assert all(x < y for x, y in zip(a, a[1:], strict=False))
    assert 10 < a[-1] < 45  # mean gap 0.5 s
    assert poisson_starts(3, None, np.random.default_rng(0)) == [0.0, 0.0, 0.0]


def test_each_round_resends_the_whole_context_with_the_served_tokens(stub_backend):
    transport = httpx.ASGITransport(app=build_app(stub_backend))
    plans = [AgentPlan(agent_id=0, rounds=((3, 2), (1, 4)))]
    result = asyncio.run(
        run_bench("http://stub", plans, vocab_size=256, seed=7, progress=False, transport=transport)
    )
    first, second = (r.prompt_token_ids for r in stub_backend.requests)
    served = [(first[-1] + 1) % 256, (first[-1] + 2) % 256]
    assert len(first) == 3 and list(second[:5]) == [*first, *served] and len(second) == 6
    assert [r.max_tokens for r in stub_backend.requests] == [2, 4]
    assert [r.generated_tokens for r in result.rounds] == [2, 4]
    summary = summarise(result)
    assert summary["requests"] == 2 and summary["generated_tokens"] == 6
    assert summary["jct_s"] >= summary["ttft_s"]["p50"] > 0
    first_round = result.rounds[0]
    assert first_round.round_index == 0 and summary["first_round_mean_s"] > 0
    assert summary["first_round_mean_s"] == first_round.done_s - first_round.sent_s < summary["jct_s"]


def test_chat_rounds_resend_the_conversation_with_the_served_replies():
    from api_stub import ApiStub

    stub = ApiStub(max_context_tokens=4096)
    transport = httpx.ASGITransport(app=build_app(stub))
    plans = [AgentPlan(agent_id=0, rounds=((5, 2), (3, 4)))]
    result = asyncio.run(
        run_bench(
            "http://stub", plans, vocab_size=256, seed=7, progress=False, transport=transport,
            endpoint="chat", model="stub",
        )
    )  # fmt: skip
    first, second = (bytes(t for t in r.prompt_token_ids if t < 256).decode() for r in stub.requests)
    user = first.removeprefix("<user>").removesuffix("\n<assistant>")
    assert len(user) == 5 and set(user) <= set("abcdefghijklmnopqrstuvwxyz ")
    reply = chr(ord(">") + 1) + chr(ord(">") + 2)  # the stub counts up from the prompt's last byte
    assert second.startswith(f"<user>{user}\n<assistant>{reply}\n<user>")
    assert [r.max_tokens for r in stub.requests] == [2, 4] and all(r.ignore_eos for r in stub.requests)
    assert [r.generated_tokens for r in result.rounds] == [2, 4]
    assert [r.prompt_tokens for r in result.rounds] == [len(r.prompt_token_ids) for r in stub.requests]
    assert result.rounds[0].info["read_side"] == "none"
