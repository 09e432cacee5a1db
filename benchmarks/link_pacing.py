"""Emulated-link efficiency: how much of its rate an emulated NIC gives one thread that sends block by block.

The runtime's senders queue their transfers on one thread each (the DE's SNIC writer, a storage read job,
the PE's KV sends), one `RateLimiter.transmit` per block or layer. Between two transfers the thread wakes
from its sleep and must take the GIL again; with a busy thread in the same process (a decode or prefill
loop) that wait is up to the interpreter's 5 ms switch interval, and the link idles meanwhile unless the
transfer names when its bytes were ready (`ready_s`, `transfer/ratelimit.py`). This script measures the
achieved share of the rate, per case:

    pacing only      N blocks through `RateLimiter.transmit` from one thread
    SNIC writer      the same blocks through `PipelinedWriter` into a `FileStore` (pacing + commits)

each with 0 or 1 CPU-bound Python threads beside it, and with and without `ready_s`.
Prints a table and writes JSON (default `benchmarks/results/link_pacing.json`).

    python benchmarks/link_pacing.py [--rate-mb-s 9.3] [--blocks 208] [--block-kib 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dualpath.kvcache import FileStore
from dualpath.kvcache.keys import KEY_BYTES
from dualpath.runtime.persist import PipelinedWriter
from dualpath.transfer import BlockWrite, RateLimiter, WriteJob
from dualpath.transfer.nic import Snic

DEFAULT_OUT = Path(__file__).parent / "results" / "link_pacing.json"


@contextmanager
def busy_threads(count: int) -> Iterator[None]:
    """`count` pure-Python threads that want the GIL all the time (the worst case of a busy engine loop)."""
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


def pacing_only(rate: float, blocks: int, block_bytes: int, ready: bool) -> float:
    limiter = RateLimiter(rate)
    start = time.monotonic()
    for _ in range(blocks):
        limiter.transmit(block_bytes, ready_s=start if ready else None)
    return time.monotonic() - start


def snic_writer(rate: float, blocks: int, block_bytes: int, ready: bool) -> float:
    """Jobs of 13 blocks (a 209-token prompt at 16-token blocks), all submitted at once, to a `FileStore`."""
    data = os.urandom(block_bytes)
    with tempfile.TemporaryDirectory(prefix="dualpath-link-") as folder:
        writer = PipelinedWriter(
            FileStore(folder, capacity_bytes=4 * blocks * block_bytes), Snic("snic", rate)
        )
        if not ready:  # the sender as it was: every block starts when its thread gets to run
            pace = writer.snic.tx.transmit
            writer.snic.tx.transmit = lambda n, c, ready_s=None: pace(n, c)  # type: ignore[method-assign]
        start = time.monotonic()
        futures = []
        for job, first in enumerate(range(0, blocks, 13)):
            keys = [
                f"{job}.{b}".encode().ljust(KEY_BYTES, b".") for b in range(first, min(first + 13, blocks))
            ]
            writes = tuple(BlockWrite(key=k, data=data, num_layers=1) for k in keys)
            futures.append(writer.submit(WriteJob(job_id=str(job), blocks=writes)))
        for future in futures:
            future.result()
        elapsed = time.monotonic() - start
        writer.close()
    return elapsed


CASES: dict[str, Callable[[float, int, int, bool], float]] = {
    "pacing only": pacing_only,
    "SNIC writer": snic_writer,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rate-mb-s", type=float, default=9.3, help="link rate, MB/s (the runtime check's SNIC)"
    )
    parser.add_argument(
        "--blocks", type=int, default=208, help="blocks per case (a DE's first-round persists)"
    )
    parser.add_argument("--block-kib", type=int, default=64, help="block size (tiny-llama, 16-token blocks)")
    parser.add_argument("--json", action="store_true", help="print the JSON object instead of the table")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON file ('' : do not write)")
    args = parser.parse_args(argv)
    if args.rate_mb_s <= 0 or args.blocks < 1 or args.block_kib < 1:
        parser.error("--rate-mb-s, --blocks and --block-kib must be positive")
    rate, block_bytes = args.rate_mb_s * 1e6, args.block_kib * 1024
    ideal_s = args.blocks * block_bytes / rate
    rows = []
    for case, run in CASES.items():
        for busy in (0, 1):
            for ready in (False, True):
                with busy_threads(busy):
                    wall_s = run(rate, args.blocks, block_bytes, ready)
                rows.append({"case": case, "busy_threads": busy, "ready_s": ready, "wall_s": wall_s,
                             "ideal_s": ideal_s, "efficiency": ideal_s / wall_s})  # fmt: skip
                if not args.json:
                    print(f"{case:<12} busy threads {busy}  ready_s {'yes' if ready else 'no ':<3}  "
                          f"{wall_s:6.3f} s for {ideal_s:.3f} s of link time: {100 * ideal_s / wall_s:5.1f} %",
                          flush=True)  # fmt: skip
    out = {
        "machine": {
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "load_average": os.getloadavg(),
            "switch_interval_s": sys.getswitchinterval(),
        },
        "rate_bytes_per_s": rate,
        "blocks": args.blocks,
        "block_bytes": block_bytes,
        "rows": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
