"""Reader for the Mooncake FAST'25 request traces (the shipped ``mooncake-conversation``), open loop.

Each line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``; ``hash_ids``
name the prompt's 512-token blocks and are chained by prefix (the same id never appears at two positions),
so the first k ids identify the first k × 512 tokens.

NOTE: session recovery. A request continues a conversation when it extends all the *full* blocks of an
earlier request (the earlier one's partial last block changes once text is appended, so its id is not
reused). With prefix-chained ids, the longest previously seen prefix of a request ends at a block that
one earlier request introduced; if the new request covers all of that request's full blocks, it
continues that request's session. Requests that share only a common system prompt (block 0 in the
conversation trace) do not cover the introducer's full blocks and start new sessions. One dict (block
id → introducing request) makes this linear in the number of blocks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dualpath.workload.errors import TraceFormatError

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake trace README: hash_ids name 512-token blocks


@dataclass(frozen=True, kw_only=True)
class TraceRequest:
    """One open-loop request; ``hit_tokens`` is the prefix already seen with an unbounded cache."""

    request_id: int
    timestamp_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    session_id: int
    hit_tokens: int


@dataclass(frozen=True, kw_only=True)
class RequestTrace:
    requests: tuple[TraceRequest, ...]
    skipped_lines: int = 0

    @property
    def num_sessions(self) -> int:
        return len({r.session_id for r in self.requests})


@dataclass(frozen=True, kw_only=True)
class _Raw:
    timestamp_ms: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def is_mooncake_record(first: object) -> bool:
    return isinstance(first, dict) and "hash_ids" in first and "input_length" in first


def read_mooncake(path: str | Path, *, skip_bad: bool = False) -> RequestTrace:
    path = Path(path)
    raws: list[_Raw] = []
    skipped = 0
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                raws.append(_parse(line))
            except (ValueError, TypeError, KeyError) as error:
                if not skip_bad:
                    detail = f"missing key {error}" if isinstance(error, KeyError) else str(error)
                    raise TraceFormatError(f"{path}:{lineno}: {detail}") from None
                skipped += 1
    # Stable sort: "earlier" means earlier arrival; ties keep file order.
    raws.sort(key=lambda r: r.timestamp_ms)
    return RequestTrace(requests=_recover_sessions(raws), skipped_lines=skipped)


def _parse(line: str) -> _Raw:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg})") from None
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    timestamp, n_in, n_out, ids = (
        record["timestamp"],
        record["input_length"],
        record["output_length"],
        record["hash_ids"],
    )
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool) or timestamp < 0:
        raise ValueError(f"timestamp must be a number >= 0 (ms), got {timestamp!r}")
    for name, value, low in (("input_length", n_in, 1), ("output_length", n_out, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise ValueError("hash_ids must be a list of integers")
    expected = math.ceil(n_in / MOONCAKE_BLOCK_TOKENS)
    if len(ids) != expected:
        raise ValueError(f"hash_ids has {len(ids)} ids, expected ceil({n_in}/512) = {expected}")
    return _Raw(timestamp_ms=float(timestamp), input_tokens=n_in, output_tokens=n_out, hash_ids=tuple(ids))


def _recover_sessions(raws: list[_Raw]) -> tuple[TraceRequest, ...]:
    introducer: dict[int, int] = {}  # block id -> index of the request that first sent it
    sessions: list[int] = []
    requests: list[TraceRequest] = []
    num_sessions = 0
    for index, raw in enumerate(raws):
        ids = raw.hash_ids
        seen = 0
        while seen < len(ids) and ids[seen] in introducer:
            seen += 1
        session = _continued_session(raws, introducer, sessions, ids, seen)
        if session is None:
            session, num_sessions = num_sessions, num_sessions + 1
        sessions.append(session)
        for block in ids[seen:]:
            introducer.setdefault(block, index)
        requests.append(
            TraceRequest(
                request_id=index,
                timestamp_s=raw.timestamp_ms / 1000.0,
                input_tokens=raw.input_tokens,
                output_tokens=raw.output_tokens,
                hash_ids=ids,
                session_id=session,
                hit_tokens=min(seen * MOONCAKE_BLOCK_TOKENS, raw.input_tokens),
            )
        )
    return tuple(requests)


def _continued_session(
    raws: list[_Raw], introducer: dict[int, int], sessions: list[int], ids: tuple[int, ...], seen: int
) -> int | None:
    if seen == 0:
        return None
    parent = introducer[ids[seen - 1]]
    parent_full_blocks = raws[parent].input_tokens // MOONCAKE_BLOCK_TOKENS
    if parent_full_blocks == 0 or seen < parent_full_blocks:
        return None
    return sessions[parent]
