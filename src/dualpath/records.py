"""The `repr` and value key of the decision core's plain slotted records (requests, commands, load reports,
candidates, decisions).

Those records are plain classes with their own `__init__` rather than dataclasses or NamedTuples, for the
native build's sake (docs/simulator-native.md), so none gets a generated `repr` or `__eq__`: each lists its
fields once, as its `__slots__`, and passes the same tuple here.
"""

from __future__ import annotations

from collections.abc import Iterable


def fields_repr(record: object, fields: Iterable[str]) -> str:
    """`Name(field=value, ...)` for `record`, in the order of `fields`."""
    args = ", ".join(f"{name}={getattr(record, name)!r}" for name in fields)
    return f"{type(record).__name__}({args})"


def fields_key(record: object, fields: Iterable[str]) -> tuple[object, ...]:
    """The values of `fields` in order: what a record compared by value compares and hashes."""
    return tuple(getattr(record, name) for name in fields)


def fields_equal(record: object, other: object, fields: Iterable[str]) -> bool:
    """`record == other` for a record compared by value: the same class and the same `fields` values."""
    return type(other) is type(record) and fields_key(record, fields) == fields_key(other, fields)
