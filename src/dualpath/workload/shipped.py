"""Request traces that ship with the package, by name (`data/traces/README.md` names their sources).

A sweep spec, `dualpath advise --trace` and `dualpath trace stats` accept a shipped trace's name
(`"mooncake-conversation"`) wherever they accept a path, so nothing shipped depends on a folder outside the
installed package. The files are package data, found through `importlib.resources`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path

# name -> file under dualpath/data/traces/
SHIPPED_TRACES: Mapping[str, str] = {
    "mooncake-conversation": "mooncake/conversation_trace.jsonl",
}


def shipped_trace(name: str) -> Path:
    """The installed file of the shipped trace `name`; KeyError (naming the shipped ones) if there is none."""
    if name not in SHIPPED_TRACES:
        raise KeyError(f"no shipped trace {name!r} (shipped: {', '.join(SHIPPED_TRACES)})")
    resource = resources.files("dualpath").joinpath("data", "traces", *SHIPPED_TRACES[name].split("/"))
    # An installed package (a wheel or an editable checkout) is a folder, so the resource is a real file.
    path = Path(str(resource))
    if not path.is_file():
        raise FileNotFoundError(f"shipped trace {name!r}: {path} is missing from the installed package")
    return path


def resolve_trace(name_or_path: str | Path, folders: Iterable[Path] = ()) -> Path:
    """A shipped trace's name, else a file: relative to each of `folders` in turn, then as given.

    FileNotFoundError names where it looked and the shipped names."""
    text = str(name_or_path)
    if text in SHIPPED_TRACES:
        return shipped_trace(text)
    candidates = [*(folder / text for folder in folders), Path(text)]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        where = ", ".join(str(p) for p in candidates)
        raise FileNotFoundError(
            f"trace {text!r} is neither a shipped trace ({', '.join(SHIPPED_TRACES)}) nor a file (looked at {where})"
        )
    return path
