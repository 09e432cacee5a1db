"""Human units at the edge: parse "80GiB", "400Gbps", "300ms", "989TFLOPS", "64K"; format them back.

Inside the program every quantity is a float (or int) in base SI units: bytes, bytes/s, seconds,
FLOP/s, tokens. Only config files, CLI flags and printed tables use the forms below.

| quantity  | accepted forms (case matters for b/B)                        | plain number |
|-----------|--------------------------------------------------------------|--------------|
| bytes     | 512, 64KiB, 80GiB, 500GB, 1.5TB, 3B (kB/KB = 1000, KiB = 1024) | bytes        |
| bandwidth | 400Gbps, 8Gbit/s, 8Gb/s (bits); 50GB/s, 3.35TB/s, 64GiB/s, 50GBps (bytes) | bytes/s |
| duration  | 250ns, 2us, 2µs, 300ms, 5s, 1.5min, 2h                       | seconds      |
| FLOP/s    | 989TFLOPS, 989TFLOP/s, 1.979PFLOPS                           | FLOP/s       |
| tokens    | 429, 64K (= 64,000), 16Ki (= 16,384), 1M (= 1,000,000), 1Mi  | tokens       |

Token counts: `K` is 1000 and `Ki` is 1024. Dataset names ("the 64K dataset", paper Table 2) and
Table 1's "16K" context are labels; the planner states which count it uses for each label.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-zµ/]*)\s*$")

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_PREFIXES = {**_DECIMAL, **_BINARY}

# "" maps to 1: a plain number is in the base unit.
_BYTE_UNITS = {"": 1.0, **{f"{p}B": f for p, f in _PREFIXES.items()}}
_BIT_RATE_UNITS = {
    f"{p}{suffix}": f / 8.0 for p, f in _PREFIXES.items() for suffix in ("bps", "bit/s", "b/s")
}
_BYTE_RATE_UNITS = {f"{p}{suffix}": f for p, f in _PREFIXES.items() for suffix in ("B/s", "Bps")}
_RATE_UNITS = {"": 1.0, **_BIT_RATE_UNITS, **_BYTE_RATE_UNITS}
_DURATION_UNITS = {
    "": 1.0,
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "min": 60.0,
    "h": 3600.0,
}
_FLOPS_UNITS = {"": 1.0} | {f"{p}{suffix}": f for p, f in _DECIMAL.items() for suffix in ("FLOPS", "FLOP/s")}
_TOKEN_UNITS = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "Ki": 2.0**10, "Mi": 2.0**20}


class UnitError(ValueError):
    """A value that does not parse as the expected quantity. The message names value and example."""


def parse_bytes(value: str | float) -> float:
    """ "80GiB" -> 85899345920.0. A plain number is bytes."""
    return _parse(value, _BYTE_UNITS, "a size in bytes", "80GiB, 500GB, 64KiB or 4096")


def parse_bandwidth(value: str | float) -> float:
    """Bytes per second. "400Gbps" (bits) -> 5e10; "50GB/s" (bytes) -> 5e10. A plain number is B/s."""
    return _parse(value, _RATE_UNITS, "a bandwidth", "400Gbps, 50GB/s or 3.35TB/s")


def parse_duration(value: str | float) -> float:
    """Seconds. "300ms" -> 0.3. A plain number is seconds."""
    return _parse(value, _DURATION_UNITS, "a duration", "300ms, 5s, 2us or 1.5min")


def parse_flops_rate(value: str | float) -> float:
    """FLOP/s. "989TFLOPS" -> 9.89e14. A plain number is FLOP/s."""
    return _parse(value, _FLOPS_UNITS, "a compute rate", "989TFLOPS or 1.979PFLOP/s")


def parse_tokens(value: str | int) -> int:
    """A token count. "64K" -> 64000, "16Ki" -> 16384. The result must be a whole number."""
    example = "429, 64K (=64000) or 16Ki (=16384)"
    tokens = _parse(value, _TOKEN_UNITS, "a token count", example)
    if tokens != int(tokens):
        raise UnitError(f"{value!r} is not a whole number of tokens: expected {example}")
    return int(tokens)


def _parse(value: str | float, units: dict[str, float], what: str, example: str) -> float:
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not {what}: expected e.g. {example}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = _NUMBER.match(value) if isinstance(value, str) else None
        if match is None:
            raise UnitError(f"{value!r} is not {what}: expected a number and a unit, e.g. {example}")
        number, unit = float(match.group(1)), match.group(2)
    if unit not in units:
        raise UnitError(f"{value!r} is not {what}: unknown unit {unit!r}; expected e.g. {example}")
    if not math.isfinite(number) or number < 0:
        raise UnitError(f"{value!r} is not {what}: expected a finite value >= 0, e.g. {example}")
    return number * units[unit]


# ----------------------------------------------------------------------------------------------
# Formatting: 4 significant digits, so parse(format(x)) == x to within 0.05 %.
# ----------------------------------------------------------------------------------------------


def format_bytes(num_bytes: float, *, binary: bool = True) -> str:
    """85899345920 -> "80 GiB" (binary) or "85.9 GB" (decimal)."""
    if binary:
        return _format(
            num_bytes,
            [("PiB", 2.0**50), ("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 1024.0)],
            "B",
        )
    return _format(num_bytes, [("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)], "B")


def format_rate(bytes_per_s: float) -> str:
    """5e10 -> "50 GB/s" (decimal, as link rates are quoted)."""
    return _format(bytes_per_s, [("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)], "B/s")


def format_duration(seconds: float) -> str:
    """0.3 -> "300 ms"."""
    if seconds >= 3600:
        return _format(seconds, [("h", 3600.0)], "s")
    if seconds >= 60:
        return _format(seconds, [("min", 60.0)], "s")
    return _format(seconds, [("s", 1.0), ("ms", 1e-3), ("us", 1e-6)], "ns", base_scale=1e-9)


def format_flops_rate(flops_per_s: float) -> str:
    """9.89e14 -> "989 TFLOPS"."""
    return _format(flops_per_s, [("PFLOPS", 1e15), ("TFLOPS", 1e12), ("GFLOPS", 1e9)], "FLOPS")


def format_tokens(tokens: int) -> str:
    """65536 -> "64Ki", 64000 -> "64K", 429 -> "429" (exact forms only, else the plain count)."""
    for unit, factor in (("Mi", 2**20), ("M", 10**6), ("Ki", 2**10), ("K", 10**3)):
        if tokens >= factor and tokens % factor == 0:
            return f"{tokens // factor}{unit}"
    return str(tokens)


def _format(value: float, scales: list[tuple[str, float]], base_unit: str, base_scale: float = 1.0) -> str:
    for unit, factor in scales:
        if abs(value) >= factor:
            return f"{_significant(value / factor)} {unit}"
    return f"{_significant(value / base_scale)} {base_unit}"


def _significant(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"
