"""Build frozen specs from plain TOML-like dicts, parsing human units by each field's name.

The unit of a value follows from the field name's suffix, so a preset and a `--set` override use
the same words as the code:

    *_bytes_per_s  bandwidth  "400Gbps", "50GB/s"      *_flops_per_s  compute  "989TFLOPS"
    *_bytes        size       "80GiB", "500GB"         *_s            time     "300ms"
    *_tokens (int) tokens     "64K", "16Ki"            other          plain number / bool / string
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dualpath import units


class ConfigError(ValueError):
    """A config value or key that cannot be used; the message names the key, the value and the fix."""


T = TypeVar("T")

_FLOAT_PARSERS: tuple[tuple[str, Callable[[str | float], float]], ...] = (
    ("_bytes_per_s", units.parse_bandwidth),
    ("_flops_per_s", units.parse_flops_rate),
    ("_bytes", units.parse_bytes),
    ("_s", units.parse_duration),
)


def build(cls: type[T], data: Mapping[str, Any], *, path: str = "") -> T:
    """`cls(**data)` with nested dataclasses built recursively and every value coerced by its field."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in known:
            raise ConfigError(
                f"unknown key {_join(path, key)!r} = {raw!r}; expected one of: {', '.join(sorted(known))}"
            )
        values[key] = coerce_field(hints[key], key, raw, path=_join(path, key))
    missing = [
        name
        for name, f in known.items()
        if name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(
            f"{path or cls.__name__}: missing key(s) {', '.join(_join(path, m) for m in missing)}"
        )
    return cls(**values)


def coerce_field(hint: Any, name: str, raw: Any, *, path: str) -> Any:
    """One value for a field of type `hint` named `name` (its suffix picks the unit)."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(raw, hint):
            return raw
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{path} = {raw!r}: expected a table of {hint.__name__} fields")
        return build(hint, raw, path=path)
    try:
        if hint is bool:
            return _to_bool(raw)
        if hint is int:
            return _to_int(name, raw)
        if hint is float:
            return _to_float(name, raw)
        if hint is str:
            if not isinstance(raw, str):
                raise ConfigError(f'expected a string such as "name", got {type(raw).__name__}')
            return raw
    except (units.UnitError, ConfigError) as error:
        raise ConfigError(f"{path} = {raw!r}: {error}") from None
    raise ConfigError(f"{path}: field type {hint!r} cannot be set from a config file")


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ConfigError("expected true or false")


def _to_int(name: str, raw: Any) -> int:
    if isinstance(raw, bool):
        raise ConfigError("expected a whole number such as 8")
    if name.endswith("_tokens"):
        return units.parse_tokens(raw)
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("+-").isdigit():
        return int(raw)
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    raise ConfigError("expected a whole number such as 8")


def _to_float(name: str, raw: Any) -> float:
    for suffix, parse in _FLOAT_PARSERS:
        if name.endswith(suffix):
            return parse(raw)
    if isinstance(raw, bool):
        raise ConfigError("expected a number such as 0.99")
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            pass
    raise ConfigError("expected a number such as 0.99")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
