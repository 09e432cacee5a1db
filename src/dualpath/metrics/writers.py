"""Explicit writers: request records as JSON Lines, time series as CSV (the only I/O in ``metrics``)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dualpath.metrics.records import RequestRecord


def write_records_jsonl(path: str | Path, records: Iterable[RequestRecord]) -> Path:
    path = Path(path)
    with path.open("w", encoding="utf-8", newline="\n") as out:
        for record in records:
            out.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")
    return path


def read_records_jsonl(path: str | Path) -> list[RequestRecord]:
    path = Path(path)
    records = []
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    records.append(RequestRecord(**json.loads(line)))
                except (ValueError, TypeError) as error:
                    raise ValueError(f"{path}:{lineno}: {error}") from None
    return records


def write_time_series_csv(
    path: str | Path, time_s: Sequence[float], series: Mapping[str, Sequence[float]]
) -> Path:
    """Columns ``time_s`` then one per series, in the mapping's order; every series as long as ``time_s``."""
    path = Path(path)
    for name, values in series.items():
        if len(values) != len(time_s):
            raise ValueError(f"series {name!r} has {len(values)} values, time_s has {len(time_s)}")
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["time_s", *series])
        for i, t in enumerate(time_s):
            writer.writerow([_cell(t), *(_cell(values[i]) for values in series.values())])
    return path


def _cell(value: float) -> str:
    return "" if isinstance(value, float) and math.isnan(value) else repr(value)
