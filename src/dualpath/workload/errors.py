"""Errors raised while reading trace files."""

from __future__ import annotations


class TraceFormatError(ValueError):
    """A trace file is malformed; the message starts with ``path:line:``."""
