"""Chaos harness: agents replayed against `dualpath serve` while nodes die, blocks rot and the disk fills.

What it checks (issue 20): no request is lost, none hangs, none gets a 5xx, and every completed greedy
output equals an undisturbed run's. Two runs on fresh stores, the same agents and the same seeded appends:

1. reference: the agents on an undisturbed cluster; every round's output tokens are recorded;
2. chaos: the same agents while, in turn,
   - every `--kill-every` s (default: the reference run's agent time ÷ 6, so that a faster runtime meets
     as many kills as a slower one) a random node is killed with SIGKILL, alternating roles (prefill,
     decode, ...), and once `serve` marks it down it is started again with `dualpath node` (the join
     details come from /health); a role's node is killed only while another of that role is up (the
     default cluster is 2P2D), so some PE and some DE always serve and a 503 "no node up" never has to
     be sent;
   - every `--corrupt-every` s a random stored block gets 64 random bytes in its middle (its checksum fails:
     the reader recomputes it, the scheduler's index drops it, the request's persist writes it again);
   - every `--disk-full-every` s the store is "full" for `--disk-full-s` s: the nodes honour a switch file in
     the store (`.dualpath-disk-full`, `runtime/node.py`) that fails every block write with ENOSPC, as a full
     disk does; no tmpfs or loop device is needed (none is available to an unprivileged user here).

Each agent is closed-loop (paper A.3): round r sends the whole context (earlier prompts + the served tokens)
plus a seeded append of random tokens, `max_tokens` fixed, `ignore_eos`. A clean refusal (a 4xx/503 with an
error body and Retry-After) is retried after the hint; so are the other outcomes, which are the failures:

    sent        requests sent (retries included)         completed   200 with all its tokens
    failed      answered with a clean error body          lost        no answer (connection dropped/refused)
    hangs       no answer within --timeout s              5xx         answers with status >= 500
    mismatches  completed outputs that differ from the reference run's same agent and round

    python benchmarks/chaos.py [--json] [--agents 12] [--rounds 26] [--kill-every S] [--seed 0]

Bounded: servers bind 127.0.0.1 on free ports; every process started here is stopped here by its pid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dualpath.runtime.launcher import ServeProcess, stop_process
from dualpath.runtime.node_links import DISK_FULL_SWITCH

FAST_LINKS = ("snic_bytes_per_s=400MB/s", "cnic_bytes_per_s=3200MB/s")  # emulated, paced, quick
_RETRIES = 20  # attempts per round before an agent gives up (never reached in a passing run)
# Node kills per reference run's agent time: the chaos run (slower, as nodes restart) then sees at least this
# many at any host or runtime speed. A kill waits while the last killed node is still restarting.
KILLS_PER_REFERENCE_RUN = 6
MIN_KILL_EVERY_S = 1.0


@dataclass
class Counts:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    hangs: int = 0
    server_errors: int = 0  # "5xx"
    mismatches: int = 0
    kills: int = 0
    kills_by_role: dict[str, int] = field(default_factory=dict)
    corrupted: int = 0
    disk_full_episodes: int = 0
    replans: int = 0  # completed requests that continued on another node after a failure
    gave_up: int = 0  # agents that stopped after _RETRIES attempts of one round
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "completed": self.completed,
            "failed": self.failed,
            "lost": self.lost,
            "hangs": self.hangs,
            "5xx": self.server_errors,
            "kills": self.kills,
            "kills_by_role": dict(self.kills_by_role),
            "corrupted": self.corrupted,
            "disk_full_episodes": self.disk_full_episodes,
            "mismatches": self.mismatches,
            "replanned": self.replans,
            "agents_gave_up": self.gave_up,
        }


@dataclass(frozen=True)
class Workload:
    agents: int
    rounds: int
    first_tokens: int
    append_tokens: int
    max_tokens: int
    seed: int
    timeout_s: float

    def append(self, agent: int, round_index: int) -> list[int]:
        rng = random.Random(self.seed * 1_000_003 + agent * 1009 + round_index)
        n = self.first_tokens if round_index == 0 else self.append_tokens
        return [rng.randrange(0, 256) for _ in range(n)]


def run_agent(
    url: str, work: Workload, agent: int, counts: Counts, outputs: dict[tuple[int, int], list[int]],
    reference: dict[tuple[int, int], list[int]] | None,
) -> None:  # fmt: skip
    """One closed-loop agent; its rounds' outputs go to `outputs`, compared with `reference` if given."""
    context: list[int] = []
    with httpx.Client(timeout=httpx.Timeout(work.timeout_s, connect=10.0)) as client:
        for r in range(work.rounds):
            context = context + work.append(agent, r)
            body = {"prompt": context, "max_tokens": work.max_tokens, "ignore_eos": True, "temperature": 0}
            tokens = _round(client, url, body, counts)
            if tokens is None:
                counts.add(gave_up=1)
                return
            outputs[(agent, r)] = tokens
            if reference is not None and reference.get((agent, r)) != tokens:
                counts.add(mismatches=1)
            context = context + tokens


def _round(client: httpx.Client, url: str, body: dict[str, Any], counts: Counts) -> list[int] | None:
    for _ in range(_RETRIES):
        counts.add(sent=1)
        try:
            response = client.post(f"{url}/v1/completions", json=body)
        except httpx.TimeoutException:
            counts.add(hangs=1)
            continue
        except httpx.TransportError:
            counts.add(lost=1)
            time.sleep(0.5)
            continue
        if response.status_code >= 500:
            counts.add(server_errors=1)
        if response.status_code == 200:
            choice = response.json()["choices"][0]
            counts.add(completed=1, replans=int(bool(response.json().get("dualpath", {}).get("replans"))))
            return [int(t) for t in choice["token_ids"]]
        counts.add(failed=1 if _clean_error(response) else 0)
        time.sleep(float(response.headers.get("retry-after", "1")))
    return None


def _clean_error(response: httpx.Response) -> bool:
    with contextlib.suppress(ValueError):
        return isinstance(response.json().get("error", {}).get("message"), str)
    return False


def run_agents(
    url: str, work: Workload, counts: Counts, reference: dict[tuple[int, int], list[int]] | None
) -> dict[tuple[int, int], list[int]]:
    outputs: dict[tuple[int, int], list[int]] = {}
    threads = [
        threading.Thread(target=run_agent, args=(url, work, a, counts, outputs, reference), daemon=True)
        for a in range(work.agents)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outputs


# ---- the chaos ----------------------------------------------------------------------------------------
class Chaos:
    """Kills and restarts nodes, corrupts blocks and fills the disk until `stop` is set."""

    def __init__(self, url: str, store: Path, counts: Counts, args: argparse.Namespace, log: Path) -> None:
        self.url, self.store, self.counts, self.args, self.log = url, store, counts, args, log
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.joined: list[subprocess.Popen[bytes]] = []  # nodes started here (stopped here)
        self.errors: list[str] = []

    def health(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/health", timeout=10).json())

    def killer(self) -> None:
        """Every `--kill-every` s, SIGKILL a node of the next role (prefill, decode, ...) while another
        node of that role is up (so a PE and a DE are always there: no 503); its restart runs meanwhile."""
        roles = ["prefill", "decode"]
        turn = 0
        restarts: list[threading.Thread] = []
        while not self.stop.wait(self.args.kill_every):
            try:
                nodes = self.health()["nodes"]
            except httpx.HTTPError as error:
                self.errors.append(f"health: {error!r}")
                continue
            role = roles[turn % 2]
            up = sorted(n for n, v in nodes.items() if v["role"] == role and v["up"])
            if len(up) < 2:
                continue  # its last restart is still starting: wait for it
            turn += 1
            name = self.rng.choice(up)
            thread = threading.Thread(target=self._kill_and_restart, args=(name, role, nodes[name]["pid"]))
            thread.start()
            restarts.append(thread)
        for thread in restarts:
            thread.join()

    def _kill_and_restart(self, name: str, role: str, pid: int) -> None:
        try:
            os.kill(int(pid), signal.SIGKILL)
            for process in list(self.joined):  # reap a node of ours, so its pid is gone, not a zombie
                if process.pid == pid:
                    process.wait()
            self.counts.add(kills=1)
            with self.counts.lock:
                self.counts.kills_by_role[role] = self.counts.kills_by_role.get(role, 0) + 1
            self._wait_up(name, up=False, timeout_s=15)
            join = self.health()["join"]
            cmd = [sys.executable, "-m", "dualpath.cli.main", "node", "--role", role, "--name", name,
                   "--scheduler", join["scheduler"], "--store", join["store"], "--config", join["config"],
                   "--namespace", join["namespace"]]  # fmt: skip
            with open(self.log, "ab") as out:
                self.joined.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
            self._wait_up(name, up=True, timeout_s=180)
        except Exception as error:  # noqa: BLE001 - reported, and the run continues
            self.errors.append(f"kill/restart {name}: {error!r}")

    def _wait_up(self, name: str, *, up: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.health()["nodes"][name]["up"] != up:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become {'up' if up else 'down'} in {timeout_s:.0f} s")
            time.sleep(0.2)

    def corrupter(self) -> None:
        while not self.stop.wait(self.args.corrupt_every):
            blocks = sorted(p for p in self.store.rglob("*.kvb") if p.is_file())
            if not blocks:
                continue
            path = self.rng.choice(blocks)
            with contextlib.suppress(OSError):  # a block being replaced this instant
                size = path.stat().st_size
                with open(path, "r+b") as f:
                    f.seek(max(0, size // 2 - 32))
                    f.write(self.rng.randbytes(64))
                self.counts.add(corrupted=1)

    def disk_filler(self) -> None:
        switch = self.store / DISK_FULL_SWITCH
        while not self.stop.wait(self.args.disk_full_every):
            switch.touch()
            self.counts.add(disk_full_episodes=1)
            self.stop.wait(self.args.disk_full_s)
            switch.unlink(missing_ok=True)
        switch.unlink(missing_ok=True)

    def close(self) -> None:
        for process in self.joined:
            stop_process(process, grace_s=10)


def _serve(store: Path, args: argparse.Namespace, log: Path) -> ServeProcess:
    settings = [
        *FAST_LINKS,
        f"num_prefill_nodes={args.prefill_nodes}",
        f"num_decode_nodes={args.decode_nodes}",
    ]
    extra = tuple(a for s in settings + list(args.set) for a in ("--set", s))
    return ServeProcess(args.config, store_dir=store, extra_args=extra, start_timeout_s=300, log_path=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=26)
    parser.add_argument("--first-tokens", type=int, default=96, help="tokens of an agent's first prompt")
    parser.add_argument("--append-tokens", type=int, default=40, help="tokens appended each later round")
    parser.add_argument("--max-tokens", type=int, default=12, help="tokens generated per round (greedy)")
    parser.add_argument("--kill-every", type=float, default=None,
                        help="seconds between node kills (default: the reference run's agent time / 6)")  # fmt: skip
    parser.add_argument("--corrupt-every", type=float, default=1.5, help="seconds between block corruptions")
    parser.add_argument(
        "--disk-full-every", type=float, default=25.0, help="seconds between disk-full spells"
    )
    parser.add_argument("--disk-full-s", type=float, default=5.0, help="how long each disk-full spell lasts")
    parser.add_argument("--timeout", type=float, default=90.0, help="a request unanswered this long hangs")
    parser.add_argument("--prefill-nodes", type=int, default=2)
    parser.add_argument("--decode-nodes", type=int, default=2)
    parser.add_argument(
        "--config", default="local-1p2d", help="cluster preset or TOML (node counts set above)"
    )
    parser.add_argument("--set", action="append", default=[], help="cluster field KEY=VALUE (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    work = Workload(args.agents, args.rounds, args.first_tokens, args.append_tokens, args.max_tokens,
                    args.seed, args.timeout)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dualpath-chaos-") as tmp:
        root = Path(tmp)
        started = time.monotonic()
        with _serve(root / "reference", args, root / "reference.log") as server:
            reference_counts = Counts()
            agents_started = time.monotonic()
            reference = run_agents(server.url, work, reference_counts, None)
            reference_agents_s = time.monotonic() - agents_started
        reference_s = time.monotonic() - started
        if args.kill_every is None:  # module doc: a fixed share of the run, not a fixed time
            args.kill_every = max(MIN_KILL_EVERY_S, reference_agents_s / KILLS_PER_REFERENCE_RUN)
        counts = Counts()
        chaos_started = time.monotonic()
        with _serve(root / "store", args, root / "serve.log") as server:
            chaos = Chaos(server.url, root / "store", counts, args, root / "nodes.log")
            workers = [
                threading.Thread(target=f, daemon=True)
                for f in (chaos.killer, chaos.corrupter, chaos.disk_filler)
            ]
            for w in workers:
                w.start()
            agents_started = time.monotonic()
            try:
                run_agents(server.url, work, counts, reference)
            finally:
                chaos_agents_s = time.monotonic() - agents_started
                chaos.stop.set()
                for w in workers:
                    w.join(timeout=200)
                healthy = _healthy(server.url)
                chaos.close()
        result = {
            **counts.summary(),
            "reference": {
                "completed": reference_counts.completed,
                "sent": reference_counts.sent,
                "wall_s": round(reference_s, 1),
                "agents_s": round(reference_agents_s, 1),
            },  # fmt: skip
            "kill_every_s": round(args.kill_every, 2),
            "chaos_wall_s": round(time.monotonic() - chaos_started, 1),
            "chaos_agents_s": round(chaos_agents_s, 1),
            "healthy_after": healthy,
            "harness_errors": chaos.errors,
            "cluster": f"{args.config} with {args.prefill_nodes}P{args.decode_nodes}D",
            "workload": {"agents": args.agents, "rounds": args.rounds, "max_tokens": args.max_tokens},
        }
        if not args.json:
            log = (root / "serve.log").read_text(errors="replace").splitlines()
            result["serve_log_tail"] = log[-15:]
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    bad = result["lost"] or result["hangs"] or result["5xx"] or result["mismatches"] or not healthy
    return 1 if bad else 0


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    return False


def _print(result: dict[str, Any]) -> None:
    print(f"chaos on {result['cluster']}, {result['workload']}")
    print(
        f"  reference run: {result['reference']['completed']} requests completed in {result['reference']['wall_s']} s"
    )
    print(f"    (agents {result['reference']['agents_s']} s)")
    print(f"  chaos run ({result['chaos_wall_s']} s, agents {result['chaos_agents_s']} s):")
    for key in ("sent", "completed", "failed", "lost", "hangs", "5xx", "mismatches", "replanned", "kills",
                "kills_by_role", "corrupted", "disk_full_episodes", "agents_gave_up", "healthy_after"):  # fmt: skip
        print(f"    {key:<20} {result[key]}")
    for error in result["harness_errors"]:
        print(f"  harness: {error}")
    for line in result.get("serve_log_tail", []):
        print(f"  serve| {line}")


if __name__ == "__main__":
    sys.exit(main())
