"""Errors of the OpenAI protocol: one exception that carries its HTTP status and the field it is about.

The body follows OpenAI and vLLM: `{"error": {"message", "type", "param", "code"}}` where `param` names the
request field at fault (None when the problem is not one field's) and `code` is the HTTP status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}


class ProtocolError(Exception):
    """A request the server refuses: HTTP `status`, a message for people, the field at fault (`param`)."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def field_path(location: Iterable[Any]) -> str:
    """A pydantic error location as a dotted field path; the leading "body" and union-branch tags drop."""
    parts = [str(p) for p in location if p != "body"]
    return ".".join(p for p in parts if not _is_branch_tag(p)) or "body"


def _is_branch_tag(part: str) -> bool:
    """pydantic names the union branch it tried (`str`, `list[int]`, `function-after[...]`): not a field."""
    return part in ("str", "int", "bool", "float", "dict", "list") or "[" in part


def validation_error(errors: Iterable[Mapping[str, Any]]) -> ProtocolError:
    """pydantic errors as one 400 that names every field at fault (first field as `param`)."""
    problems: list[str] = []
    fields: list[str] = []
    for error in errors:
        kind = error.get("type")
        path = "body" if kind == "json_invalid" else field_path(error.get("loc", ()))
        message = str(error.get("msg", "invalid"))
        if kind == "extra_forbidden":
            message = "unknown field (not part of the request schema)"
        if path not in fields:  # the first problem per field: a union's other branches add only noise
            problems.append(f"{path}: {message}")
            fields.append(path)
    if not problems:
        return ProtocolError(400, "malformed request body")
    return ProtocolError(400, "; ".join(problems[:8]), param=fields[0] if fields[0] != "body" else None)
