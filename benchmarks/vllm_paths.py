"""Basic vs DualPath through vLLM: one vLLM engine with DualPathConnector, storage bound by emulated SNICs.

    python benchmarks/vllm_paths.py --json        # needs the vLLM extra (make vllm); ≈ 1.5 min on 2 cores

The set-up, workload and figures are described in `dualpath.integrations.vllm.paths` (shared with
`dualpath demo --engine vllm`); measured figures are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dualpath.integrations.vllm.paths import PathsOptions, format_summary, run_paths


def main() -> None:
    defaults = PathsOptions()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=defaults.agents)
    parser.add_argument(
        "--rounds", type=int, default=defaults.rounds, help="timed rounds after the untimed first"
    )
    parser.add_argument("--context", type=int, default=defaults.context, help="first-round prompt tokens")
    parser.add_argument("--append", type=int, default=defaults.append, help="tokens appended per round")
    parser.add_argument("--output", type=int, default=defaults.output, help="generated tokens per round")
    parser.add_argument("--decode-nodes", type=int, default=defaults.decode_nodes)
    parser.add_argument("--snic-mb-s", type=float, default=defaults.snic_mb_s, help="every SNIC's rate, MB/s")
    parser.add_argument("--load-mode", choices=("staged", "layerwise"), default=defaults.load_mode)
    parser.add_argument(
        "--json", action="store_true", help="one JSON object on stdout (vLLM logs go to stderr)"
    )
    args = parser.parse_args()
    options = PathsOptions(
        agents=args.agents,
        rounds=args.rounds,
        context=args.context,
        append=args.append,
        output=args.output,
        decode_nodes=args.decode_nodes,
        snic_mb_s=args.snic_mb_s,
        load_mode=args.load_mode,
    )
    if args.json:
        # vLLM logs to stdout by default; keep stdout for the JSON object
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        summary = run_paths(options)
        print(json.dumps(summary, indent=2))
    else:
        summary = run_paths(options, say=lambda text: print(text, file=sys.stderr, flush=True))
        print(format_summary(summary))


if __name__ == "__main__":
    main()
