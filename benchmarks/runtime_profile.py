"""Where a request's time goes in the runtime, piece by piece, beside the raw model forward of the same shapes.

For each mode (default: oracle and dualpath), a fresh `local-1p2d` cluster runs with per-piece timings on
(`runtime/spans.py`: every process records its pieces' wall and thread CPU time, and a mark at each end of
every control message). It replays the demo's trace (16 agents x 5 rounds, as `dualpath demo`), then serves
one request alone (an agent of its own: two rounds make its hit, the third is profiled). Reported:

- one request: its pieces in order (HTTP in, scheduler submit, placement, reads, command trips, the PE
  forward and its parts, hand-off, the DE's copy into its cache, each decode run with its model steps and
  sampling, detokenize, SSE, the chunks' way to the client), wall and CPU, and the raw model forward and
  decode steps of the same shapes timed alone in this process (`model_speed.forward_time_s`,
  `decode_time_s`);
- the whole replay: every piece's count, wall and CPU summed, the command trips per message type, the CPU
  of each process over the replay (/proc), and the replay's JCT against the sum of its raw model forwards
  and decode steps (CPU time on one core, one torch thread, as a node runs them).

    python benchmarks/runtime_profile.py [--json] [--modes oracle dualpath] [--agents 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from model_speed import decode_time_s, forward_time_s

from dualpath.cli.demo_twin import host_probe_cpu_s
from dualpath.config.loader import load_model
from dualpath.runtime.bench import BenchOptions
from dualpath.runtime.bench import run as run_replay
from dualpath.runtime.launcher import ServeProcess
from dualpath.runtime.loadgen import AgentPlan, BenchResult, run_bench
from dualpath.runtime.model import Transformer, config_from_model_spec
from dualpath.runtime.os_thread import ENGINE_THREAD_NAMES
from dualpath.runtime.spans import PROFILE_DIR_ENV, read_spans

# The lone request: an agent's rounds (append, generated) scaled as the demo's are; the third is profiled.
LONE_ROUNDS = ((1024, 8), (32, 8), (32, 8))
LONE_AGENT = 10_000  # an agent id of its own: its prompt shares no block with the replay's
Record = dict[str, Any]


# ---- running -------------------------------------------------------------------------------------------
def proc_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (utime + stime, /proc) of a process: `all` its threads, and `engine` its engine thread
    (named `pe-worker` / `de-decode` at the OS level, `runtime/os_thread.py`)."""
    out = {"all": 0.0, "engine": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            head, tail = (task / "stat").read_text().rsplit(")", 1)
            cpu = (int(tail.split()[11]) + int(tail.split()[12])) / os.sysconf("SC_CLK_TCK")
            out["all"] += cpu
            if head.split("(", 1)[1] in ENGINE_THREAD_NAMES:
                out["engine"] += cpu
    return out


def processes(server: ServeProcess, health: dict[str, Any]) -> dict[str, int]:
    assert server.process is not None
    nodes = {name: int(n["pid"]) for name, n in dict(health.get("nodes", {})).items() if n.get("pid")}
    return {"scheduler": server.process.pid, **nodes}


def run_profiled(mode: str, options: BenchOptions, folder: Path) -> dict[str, Any]:
    """The replay and the lone request on one fresh cluster with spans on; the records and client times."""
    os.environ[PROFILE_DIR_ENV] = str(folder)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="dualpath-store-") as store,
            ServeProcess("local-1p2d", mode=mode, store_dir=Path(store)) as server,
        ):
            pids = processes(server, server.health)
            probe0 = host_probe_cpu_s()  # ≈ 1 s, before the replay's CPU window opens
            cpu0 = {name: proc_cpu_s(pid) for name, pid in pids.items()}
            client0 = time.process_time()
            summary, replay = run_replay(server.url, options, progress=False)
            cpu = {
                f"{name} {k}": v - cpu0[name][k]
                for name, pid in pids.items()
                for k, v in proc_cpu_s(pid).items()
            }
            cpu = {k: v for k, v in cpu.items() if not k.startswith("scheduler engine")}
            cpu["client all"] = time.process_time() - client0  # this process: plans, replay, /metrics
            plan = AgentPlan(agent_id=LONE_AGENT, rounds=LONE_ROUNDS)
            lone = asyncio.run(run_bench(server.url, [plan], vocab_size=int(server.health.get("vocab_size", 256)),
                                         seed=1, progress=False, model=server.health.get("model")))  # fmt: skip
            probe = (probe0 + host_probe_cpu_s()) / 2
    finally:
        os.environ.pop(PROFILE_DIR_ENV, None)
    return {"summary": summary, "replay": replay, "lone": lone, "cpu": cpu, "probe_cpu_s": probe,
            "records": read_spans(folder)}  # fmt: skip


# ---- reading the records ---------------------------------------------------------------------------------
def message_id(record: Record, node: str) -> tuple[Any, ...]:
    return (record.get("msg"), node, record.get("rid"), record.get("step"), record.get("step_id"))


def trips(records: list[Record]) -> dict[str, list[tuple[float, float]]]:
    """(sent, received) of every control message, per direction and type: scheduler -> node pairs a
    `sched.send` with the node's `node.recv`, node -> scheduler a `node.emit` with the `sched.recv`."""
    ends: dict[tuple[str, tuple[Any, ...]], list[float]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r["t"]):
        if r["piece"] == "sched.send":
            ends[("out", message_id(r, r["node"]))].append(r["t"])
        elif r["piece"] == "node.recv":
            ends[("in@node", message_id(r, r["process"]))].append(r["t"])
        elif r["piece"] == "node.emit":
            ends[("up", message_id(r, r["process"]))].append(r["t"])
        elif r["piece"] == "sched.recv":
            ends[("in@sched", message_id(r, r["node"]))].append(r["t"])
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (direction, key), sent in ends.items():
        if direction in ("out", "up"):
            received = ends.get(("in@node" if direction == "out" else "in@sched", key), [])
            label = f"{'scheduler -> node' if direction == 'out' else 'node -> scheduler'} {key[0]}"
            out[label] += list(zip(sent, received, strict=False))
    return out


def trip_of(records: list[Record], msg: str, node: str, **keys: Any) -> tuple[float, float] | None:
    """The (sent, received) of one message, found by its type, node and keys."""
    want = {k: v for k, v in keys.items()}
    sent = [r["t"] for r in records if r["piece"] in ("sched.send", "node.emit") and r.get("msg") == msg
            and r.get("node", r["process"]) == node and all(r.get(k) == v for k, v in want.items())]  # fmt: skip
    got = [r["t"] for r in records if r["piece"] in ("node.recv", "sched.recv") and r.get("msg") == msg
           and r.get("node", r["process"]) == node and all(r.get(k) == v for k, v in want.items())]  # fmt: skip
    return (min(sent), min(got)) if sent and got else None


def spans(records: Iterable[Record], piece: str, **keys: Any) -> list[Record]:
    return [
        r
        for r in records
        if r["piece"] == piece and "wall" in r and all(r.get(k) == v for k, v in keys.items())
    ]


def total(found: list[Record], key: str) -> float:
    return sum(float(r[key]) for r in found)


# ---- raw model times ---------------------------------------------------------------------------------------
class RawModel:
    """The served model timed alone in this process on the shapes the cluster ran (memoised)."""

    def __init__(self, repeats: int) -> None:
        torch.set_num_threads(1)  # as a node runs its engine
        self.model = Transformer.random(config_from_model_spec(load_model("tiny-llama")), seed=0)
        self.repeats = repeats
        self._memo: dict[tuple[Any, ...], tuple[float, float]] = {}

    def forward(self, items: list[list[Any]]) -> tuple[float, float]:
        shape = tuple((int(c), int(n), bool(done)) for _, c, n, done in items)
        if ("f", shape) not in self._memo:
            self._memo[("f", shape)] = forward_time_s(self.model, list(shape), self.repeats)
        return self._memo[("f", shape)]

    def decode(self, contexts: list[int]) -> tuple[float, float]:
        shape = tuple(sorted(int(c) for c in contexts))
        if ("d", shape) not in self._memo:
            self._memo[("d", shape)] = decode_time_s(self.model, list(shape), self.repeats)
        return self._memo[("d", shape)]


# ---- one request -------------------------------------------------------------------------------------------
def lone_request(run: dict[str, Any], raw: RawModel) -> dict[str, Any]:
    """The lone agent's last request, piece by piece (ms from the client's send)."""
    lone: BenchResult = run["lone"]
    record = lone.rounds[-1]
    t0 = lone.started_monotonic_s
    sent, first, done = t0 + record.sent_s, t0 + record.first_token_s, t0 + record.done_s
    records = [r for r in run["records"] if sent - 0.001 <= r["t"] <= done + 0.5]
    submit = next(r for r in records if r["piece"] == "api.submit" and r["request_id"] == record.request_id)
    rid = submit["rid"]
    rows: list[dict[str, Any]] = []

    def row(
        piece: str, start: float, wall: float, cpu: float | None = None, raw_s: float | None = None
    ) -> None:
        rows.append({"piece": piece, "start_ms": 1e3 * (start - sent), "wall_ms": 1e3 * wall,
                     "cpu_ms": None if cpu is None else 1e3 * cpu, "raw_ms": None if raw_s is None else 1e3 * raw_s})  # fmt: skip

    validate = [r for r in spans(records, "api.validate") if r["t"] <= submit["t"]]
    own = spans(records, "sched.submit", request_id=record.request_id)
    row(
        "HTTP in: client send -> request submitted",
        sent,
        submit["t"] - sent,
        total(validate[-1:] + own, "cpu"),
    )
    row("  of which API validation (server)", validate[-1]["t"] if validate else sent, total(validate[-1:], "wall"),
        total(validate[-1:], "cpu"))  # fmt: skip
    row(
        "  of which scheduler submit (store hit, driver)",
        own[0]["t"] if own else sent,
        total(own, "wall"),
        total(own, "cpu"),
    )
    for side in ("p0", "d0", "d1"):
        trip = trip_of(records, "read", side, rid=rid)
        back = trip_of(records, "read_done", side, rid=rid)
        if trip and back:
            row(f"read on {side}: command sent -> read_done received", trip[0], back[1] - trip[0])
            row("  command trip", trip[0], trip[1] - trip[0])
            scatter = spans(records, "pe.scatter" if side == "p0" else "de.scatter", rid=rid)
            row("  scatter into the request's region", scatter[0]["t"] if scatter else trip[1], total(scatter, "wall"),
                total(scatter, "cpu"))  # fmt: skip
            row("  read_done trip", back[0], back[1] - back[0])
    for fwd in [f for f in spans(records, "pe.forward") if any(item[0] == rid for item in f["items"])]:
        step = fwd["step_id"]
        trip = trip_of(records, "step", "p0", step_id=step)
        if trip:
            row(f"step {step}: command trip scheduler -> PE", trip[0], trip[1] - trip[0])
            row("  PE queue (received -> forward starts)", trip[1], fwd["t"] - trip[1])
        raw_cpu, _ = raw.forward(fwd["items"])
        items = ", ".join(f"{c}+{n}" for _, c, n, _ in fwd["items"])
        row(
            f"  PE forward ({len(fwd['items'])} items, cached+new: {items})",
            fwd["t"],
            fwd["wall"],
            fwd["cpu"],
            raw_cpu,
        )
        for piece, label in (("pe.inline_read", "inline hit read (oracle)"), ("pe.embed", "embed"),
                             ("pe.layer", "layers (compute thread)"), ("pe.load", "loads (I/O thread)"),
                             ("pe.head", "head + sampling"), ("pe.send", "KV sends (transmit thread)"),
                             ("pe.after_sends", "kv_done notices")):  # fmt: skip
            found = (
                spans(records, piece, step_id=step)
                if piece != "pe.inline_read"
                else spans(records, piece, rid=rid)
            )
            if found:
                row(f"    {label}", found[0]["t"], total(found, "wall"), total(found, "cpu"))
        back = trip_of(records, "step_done", "p0", step_id=step)
        if back:
            row("  step_done trip PE -> scheduler", back[0], back[1] - back[0])
        out = trip_of(records, "kv_out_done", "p0", step_id=step)
        if out:
            row(
                "  hand-off: forward end -> kv_out_done received",
                fwd["t"] + fwd["wall"],
                out[1] - fwd["t"] - fwd["wall"],
            )
    chunks = sorted(r["t"] for r in records if r["piece"] == "sched.chunk" and r.get("rid") == rid)
    if chunks:
        row("token 1: chunk queued -> client has it (API, SSE, HTTP)", chunks[0], first - chunks[0])
    for copy in spans(records, "de.join_copy", rid=rid) + spans(records, "de.h2d", rid=rid):
        row(
            f"DE copy into its cache ({copy['piece']}, {copy['tokens']} tokens)",
            copy["t"],
            copy["wall"],
            copy["cpu"],
        )
    for node in ("d0", "d1"):
        for run_span in [r for r in spans(records, "de.run") if rid in r["rids"] and r["process"] == node]:
            step = run_span["step"]
            trip = trip_of(records, "decode_step", node, step=step)
            if trip:
                row(f"decode run {step} on {node}: command trip", trip[0], trip[1] - trip[0])
                row("  DE queue (received -> run starts)", trip[1], run_span["t"] - trip[1])
            models = [r for r in spans(records, "de.model", step=step) if r["process"] == node]
            samples = [r for r in spans(records, "de.sample", step=step) if r["process"] == node]
            raw_cpu = sum(raw.decode(m["contexts"])[0] for m in models)
            row(f"  run ({len(models)} steps, batch {len(run_span['rids'])})", run_span["t"], run_span["wall"],
                run_span["cpu"], raw_cpu)  # fmt: skip
            row(
                "    model steps",
                models[0]["t"] if models else run_span["t"],
                total(models, "wall"),
                total(models, "cpu"),
                raw_cpu,
            )
            row(
                "    sampling",
                samples[0]["t"] if samples else run_span["t"],
                total(samples, "wall"),
                total(samples, "cpu"),
            )
            back = trip_of(records, "decode_done", node, step=step)
            if back:
                row("  decode_done trip DE -> scheduler", back[0], back[1] - back[0])
    detok = spans(records, "api.detokenize", request_id=record.request_id)
    sse = spans(records, "api.sse", request_id=record.request_id)
    row(
        f"detokenize ({len(detok)} chunks)",
        detok[0]["t"] if detok else done,
        total(detok, "wall"),
        total(detok, "cpu"),
    )
    row(f"SSE chunks built ({len(sse)})", sse[0]["t"] if sse else done, total(sse, "wall"), total(sse, "cpu"))
    if chunks:
        row("last chunk queued -> client done", chunks[-1], done - chunks[-1])
    row("whole request (client send -> last chunk)", sent, done - sent)
    return {"rid": rid, "prompt_tokens": record.prompt_tokens, "generated_tokens": record.generated_tokens,
            "hit_tokens": record.info.get("hit_tokens"), "read_side": record.info.get("read_side"),
            "ttft_ms": 1e3 * record.ttft_s, "latency_ms": 1e3 * (done - sent), "pieces": rows}  # fmt: skip


# ---- the whole replay ------------------------------------------------------------------------------------------
def replay_profile(run: dict[str, Any], raw: RawModel) -> dict[str, Any]:
    replay: BenchResult = run["replay"]
    start = replay.started_monotonic_s
    end = start + replay.wall_s
    records = [r for r in run["records"] if start <= r["t"] <= end]
    pieces: dict[str, dict[str, float]] = {}
    for r in records:
        if "wall" in r:
            p = pieces.setdefault(f"{r['process']} {r['piece']}", {"count": 0, "wall_s": 0.0, "cpu_s": 0.0})
            p["count"] += 1
            p["wall_s"] += r["wall"]
            p["cpu_s"] += r["cpu"]
    trip_rows = {}
    for label, pairs in sorted(trips(records).items()):
        waits = [b - a for a, b in pairs if b >= a]
        if waits:
            trip_rows[label] = {"count": len(waits), "mean_ms": 1e3 * statistics.mean(waits),
                                "p90_ms": 1e3 * sorted(waits)[int(0.9 * (len(waits) - 1))], "total_s": sum(waits)}  # fmt: skip
    forwards = spans(records, "pe.forward")
    models = spans(records, "de.model")
    raw_forward_s = sum(raw.forward(f["items"])[0] for f in forwards)
    raw_decode_s = sum(raw.decode(m["contexts"])[0] for m in models)
    jct = float(run["summary"]["jct_s"])
    return {
        "jct_s": jct,
        "ttft_mean_s": run["summary"]["ttft_s"]["mean"],
        "requests": len(replay.rounds),
        "generated_tokens": run["summary"]["generated_tokens"],
        "forwards": len(forwards),
        "decode_steps": len(models),
        "raw_forward_s": raw_forward_s,
        "raw_decode_s": raw_decode_s,
        "raw_model_s": raw_forward_s + raw_decode_s,
        "jct_over_raw_model": jct / (raw_forward_s + raw_decode_s),
        "engine_wall_s": {
            "pe.forward": total(forwards, "wall"),
            "de.run": total(spans(records, "de.run"), "wall"),
        },
        "engine_cpu_s": {
            "pe.forward": total(forwards, "cpu"),
            "de.run": total(spans(records, "de.run"), "cpu"),
        },
        "process_cpu_s": run["cpu"],
        "probe_cpu_s": run["probe_cpu_s"],
        "pieces": dict(sorted(pieces.items())),
        "trips": trip_rows,
    }


# ---- output ---------------------------------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:>9.2f}"


def format_mode(mode: str, lone: dict[str, Any], replay: dict[str, Any]) -> str:
    lines = [f"== {mode}: one request (rid {lone['rid']}, prompt {lone['prompt_tokens']}, hit {lone['hit_tokens']}, "
             f"{lone['generated_tokens']} generated, read side {lone['read_side']}): TTFT {lone['ttft_ms']:.1f} ms, "
             f"latency {lone['latency_ms']:.1f} ms",  # fmt: skip
             f"{'piece':<62}{'start ms':>9}{'wall ms':>9}{'CPU ms':>9}{'raw ms':>9}"]  # fmt: skip
    for p in lone["pieces"]:
        lines.append(
            f"{p['piece'][:62]:<62}{p['start_ms']:>9.1f}{_ms(p['wall_ms'])}{_ms(p['cpu_ms'])}{_ms(p['raw_ms'])}"
        )
    r = replay
    lines += [
        "",
        f"== {mode}: the whole replay ({r['requests']} requests, {r['generated_tokens']} tokens): JCT {r['jct_s']:.2f} s; "
        f"raw model {r['raw_model_s']:.2f} s (forwards {r['raw_forward_s']:.2f} s in {r['forwards']}, decode steps "
        f"{r['raw_decode_s']:.2f} s in {r['decode_steps']}); JCT / raw = {r['jct_over_raw_model']:.2f}",
        "process CPU over the replay (s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in r["process_cpu_s"].items()),
        f"{'piece (process, name)':<40}{'count':>7}{'wall s':>9}{'CPU s':>9}",
    ]
    for name, p in r["pieces"].items():
        lines.append(f"{name:<40}{p['count']:>7.0f}{p['wall_s']:>9.3f}{p['cpu_s']:>9.3f}")
    lines.append(f"{'command trip':<40}{'count':>7}{'mean ms':>9}{'p90 ms':>9}{'sum s':>9}")
    for name, t in r["trips"].items():
        lines.append(f"{name:<40}{t['count']:>7}{t['mean_ms']:>9.2f}{t['p90_ms']:>9.2f}{t['total_s']:>9.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--modes", nargs="+", default=["oracle", "dualpath"], choices=("basic", "dualpath", "oracle")
    )
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--raw-repeats", type=int, default=1, help="timed repeats per raw shape (after a warm-up)"
    )
    args = parser.parse_args(argv)
    options = BenchOptions(agents=args.agents, max_rounds=args.rounds)
    load_start, started = os.getloadavg(), time.monotonic()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="dualpath-profile-") as folder:
        for mode in args.modes:
            runs[mode] = run_profiled(mode, options, Path(folder) / mode)
            if not args.json:
                print(
                    f"[{mode}] replay JCT {runs[mode]['summary']['jct_s']:.2f} s; timing the raw model ...",
                    flush=True,
                )
    raw = RawModel(args.raw_repeats)
    modes = {
        mode: {"one_request": lone_request(run, raw), "replay": replay_profile(run, raw)}
        for mode, run in runs.items()
    }
    out = {
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
        },  # fmt: skip
        "trace": {"agents": args.agents, "rounds": args.rounds, "lone_rounds": LONE_ROUNDS},
        "modes": modes,
        "wall_s": time.monotonic() - started,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for mode, m in modes.items():
            print(format_mode(mode, m["one_request"], m["replay"]) + "\n")
        print(f"load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
