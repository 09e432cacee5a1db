"""A fake executor for `RuntimeDriver` on a virtual clock: no processes, fixed durations per message."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dualpath.runtime.driver import CLIENT, DriverConfig, RuntimeDriver

KV_BYTES_PER_TOKEN = 4096.0
DECODE_STEP_S = 0.005


def small_config(mode: str = "dualpath", **over: Any) -> DriverConfig:
    base: dict[str, Any] = dict(
        node_names=("p0", "d0", "d1"),
        num_prefill_nodes=1,
        engines_per_node=1,
        mode=mode,
        read_path=None,
        block_tokens=16,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        dram_buffer_bytes=64 * 2**20,
        de_hbm_kv_tokens=8192,
        pe_hbm_kv_tokens=8192,
        snic_bytes_per_s=4e6,
        prefill_tokens_per_s=4000.0,
        attention_s_per_token_pair=1e-7,
    )
    base.update(over)
    return DriverConfig(**base)


@dataclass
class FakeCluster:
    """Executes every node message after a fixed virtual duration and reports back, in time order."""

    driver: RuntimeDriver
    corrupt_reads: dict[int, int] = field(default_factory=dict)  # rid -> usable tokens its read reports
    now_s: float = 0.0
    tokens: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    done: dict[int, dict[str, Any]] = field(default_factory=dict)
    sent: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    _queue: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # DE node -> its decode run in flight
    cuts: int = 0  # runs a `decode_cut` shortened

    def at(self, t: float, event: dict[str, Any]) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), event))

    def submit_at(self, t: float, token_ids: list[int], hit_tokens: int, max_tokens: int) -> None:
        self.at(
            t, {"type": "@submit", "token_ids": token_ids, "hit_tokens": hit_tokens, "max_tokens": max_tokens}
        )

    def run(self, until_s: float = 1e6) -> None:
        while self._queue and self._queue[0][0] <= until_s:
            self.now_s, _, event = heapq.heappop(self._queue)
            if event["type"] == "decode_done" and self.runs.get(event["node"], {}).get("event") is not event:
                continue  # a cut replaced this run's end
            if event["type"] == "decode_done":
                del self.runs[event["node"]]
            if event["type"] == "@submit":
                body = {k: v for k, v in event.items() if k != "type"}
                _, out = self.driver.submit(**body, now_s=self.now_s)
            else:
                out = self.driver.handle(event, self.now_s)
            self._dispatch(out)
            # Coalesced fetch: once per instant, after what is already queued for this instant.
            if self.driver.wants_fetch and not any(
                e["type"] == "fetch" and t == self.now_s for t, _, e in self._queue
            ):
                self.at(self.now_s, {"type": "fetch"})

    def _dispatch(self, out: list[tuple[str, dict[str, Any]]]) -> None:
        t = self.now_s
        kv = KV_BYTES_PER_TOKEN
        for dest, m in out:
            self.sent.append((t, dest, m))
            kind = m["type"]
            if dest == CLIENT:
                if kind == "tokens":
                    self.tokens[m["rid"]] += m["token_ids"]
                else:
                    self.done[m["rid"]] = m
            elif kind == "read":
                usable = self.corrupt_reads.get(m["rid"], m["tokens"])
                event = {"type": "read_done", "node": dest, "rid": m["rid"], "usable_tokens": usable}
                self.at(t + m["tokens"] * kv / 4e6, event)
            elif kind == "step":
                new = sum(i["new_tokens"] for i in m["items"])
                end = t + 0.001 + new / 4000.0
                first = [[i["rid"], 1000 + i["rid"]] for i in m["items"] if i["completes_prefill"]]
                self.at(
                    end, {"type": "step_done", "node": dest, "step_id": m["step_id"], "first_tokens": first}
                )
                self.at(end, {"type": "kv_out_done", "node": dest, "step_id": m["step_id"]})
            elif kind == "h2d":
                self.at(t + m["tokens"] * kv / 64e6, {"type": "h2d_done", "node": dest, "rid": m["rid"]})
            elif kind == "persist":
                event = {"type": "persist_done", "node": dest, "rid": m["rid"], "from_hbm": m["from_hbm"]}
                self.at(t + m["tokens"] * kv / 4e6, event)
            elif kind == "decode_step":
                self._run_end(dest, {"start": t, "message": m}, int(m["steps"]))
            elif kind == "decode_cut":
                run = self.runs.get(dest)
                if run is not None and run["message"]["step"] == m["step"]:
                    done = min(int(run["steps"]), int((t - run["start"]) / DECODE_STEP_S) + 1)
                    self.cuts += done < run["steps"]
                    self._run_end(dest, run, done)

    def _run_end(self, node: str, run: dict[str, Any], steps: int) -> None:
        """The run's decode_done after `steps` steps (a cut calls again with fewer)."""
        m = run["message"]
        tokens = [[rid, [2000 + rid] * steps] for rid in m["batch"]]
        event = {"type": "decode_done", "node": node, "step": m["step"], "steps": steps, "tokens": tokens}
        self.runs[node] = {**run, "steps": steps, "event": event}
        self.at(run["start"] + steps * DECODE_STEP_S, event)
