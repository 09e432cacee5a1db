"""A minimal TOML writer (the standard library reads TOML but cannot write it), for presets we write.

Handles what a preset holds (`twin.calibration`): tables, strings, booleans, ints, floats (including inf), and arrays of
scalars. Comments may be attached to a key by its dotted path; they are written after the value.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def dumps(document: Mapping[str, Any], *, header: str = "", comments: Mapping[str, str] | None = None) -> str:
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    comments = comments or {}
    _table(document, (), lines, comments)
    return "\n".join(lines).strip("\n") + "\n"


def _table(
    table: Mapping[str, Any], path: tuple[str, ...], lines: list[str], comments: Mapping[str, str]
) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    if path and (scalars or not tables):
        lines.append("")
        lines.append(f"[{'.'.join(_key(p) for p in path)}]")
    for key, value in scalars:
        note = comments.get(".".join((*path, key)))
        lines.append(f"{_key(key)} = {_value(value)}" + (f"  # {note}" if note else ""))
    for key, value in tables:
        _table(value, (*path, str(key)), lines, comments)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)  # numpy scalars print as np.float64(...) otherwise
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML: {value!r}")
