"""Token equality on the real runtime: every request's greedy output ids, per mode, dumped and compared.

Replays one trace (default: the demo's, 16 agents x 5 rounds of the 64K dataset scaled x 1/32) on a fresh
`local-1p2d` cluster per mode (basic, dualpath, oracle; each its own empty store), greedily, and records
the ids each request was served. The three read paths must serve the same ids (the model's kernels are
batch-invariant, docs/model.md), and a change to the runtime's hot path must not change them either:
`--out` writes the dump, `--compare` checks a run against an earlier dump, request by request.

    python benchmarks/runtime_tokens.py --out tokens.json                 # record
    python benchmarks/runtime_tokens.py --compare tokens.json [--json]    # exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from dualpath.runtime.bench import BenchOptions
from dualpath.runtime.bench import run as run_bench
from dualpath.runtime.launcher import ServeProcess

MODES = ("basic", "dualpath", "oracle")


def served_ids(mode: str, options: BenchOptions, *, config: str = "local-1p2d") -> dict[str, list[int]]:
    """`{"agent.round": ids}` for every request of the trace, replayed on a fresh cluster in `mode`."""
    with (
        tempfile.TemporaryDirectory(prefix="dualpath-store-") as store,
        ServeProcess(config, mode=mode, store_dir=Path(store)) as server,
    ):
        _, result = run_bench(server.url, options, progress=False)
    return {f"{r.agent_id}.{r.round_index}": list(r.token_ids) for r in result.rounds}


def digest(ids: dict[str, list[int]]) -> str:
    return hashlib.sha256(json.dumps(ids, sort_keys=True).encode()).hexdigest()[:16]


def differences(a: dict[str, list[int]], b: dict[str, list[int]], limit: int = 5) -> list[str]:
    """The first `limit` requests whose ids differ (or that one side lacks), as readable lines."""
    out = []
    for key in sorted(set(a) | set(b), key=lambda k: tuple(int(x) for x in k.split("."))):
        if a.get(key) != b.get(key):
            out.append(f"request {key}: {a.get(key)} vs {b.get(key)}")
            if len(out) == limit:
                break
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dataset", default="64k")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--out", type=Path, help="write the dump (JSON) here")
    parser.add_argument("--compare", type=Path, help="an earlier dump: every request must match it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    options = BenchOptions(dataset=args.dataset, agents=args.agents, max_rounds=args.rounds)
    started = time.monotonic()
    modes = {}
    for mode in args.modes:
        modes[mode] = served_ids(mode, options)
        if not args.json:
            tokens = sum(len(v) for v in modes[mode].values())
            print(f"{mode:9s} {len(modes[mode])} requests, {tokens} tokens, digest {digest(modes[mode])}")
    problems = []
    first = args.modes[0]
    for mode in args.modes[1:]:
        problems += [f"{mode} vs {first}: {line}" for line in differences(modes[mode], modes[first])]
    if args.compare is not None:
        earlier = json.loads(args.compare.read_text())["modes"]
        for mode in args.modes:
            if mode in earlier:
                problems += [
                    f"{mode} vs {args.compare}: {line}" for line in differences(modes[mode], earlier[mode])
                ]
    out = {
        "trace": {"dataset": args.dataset, "agents": args.agents, "rounds": args.rounds},
        "digests": {mode: digest(ids) for mode, ids in modes.items()},
        "equal": not problems,
        "problems": problems,
        "load_average": os.getloadavg(),
        "wall_s": time.monotonic() - started,
        "modes": modes,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps({k: v for k, v in out.items() if k != "modes"}, indent=2))
    else:
        print("equal" if not problems else "DIFFERENT:\n  " + "\n  ".join(problems))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
