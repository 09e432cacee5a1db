"""Load hardware, model and cluster specs from TOML presets or files, with `--set key=value` overrides.

Preset folders inside the package (`dualpath/presets/`):

    hardware/<name>.toml    -> HardwareSpec   (hopper-8x400g, h800, h100, h200, gb200-nvl72)
    model/<name>.toml       -> ModelSpec      (deepseek-v3.2, deepseek-v3, ds-27b, qwen2.5-32b, ...)
                               or a Hugging Face model folder (config.json), e.g. `--model ./Qwen2-0.5B`
    pd-cluster/<name>.toml  -> ClusterSpec    (hardware + model + P/D + scheduler, e.g. ds660b-2p4d)

(`presets/cluster/` holds the runtime's process layouts; `dualpath.runtime.cluster` reads those.)

A document may start from another with `extends = "<preset name or path>"`; its own keys are merged
over the base, table by table. Keys are the spec field names; values carry human units
(see `dualpath.config.coerce`). The format is described in docs/config.md.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from dualpath.config.coerce import ConfigError, build, coerce_field
from dualpath.config.hf_model import hf_model_document, is_model_folder
from dualpath.config.specs import ClusterSpec, HardwareSpec, ModelSpec
from dualpath.config.validate import Spec, validate

HARDWARE, MODEL, PD_CLUSTER = "hardware", "model", "pd-cluster"
DEFAULT_HARDWARE = "hopper-8x400g"
DEFAULT_MODEL = "deepseek-v3.2"
_MAX_EXTENDS_DEPTH = 8

S = TypeVar("S", bound=Spec)


def preset_names(kind: str) -> list[str]:
    """Names of the packaged presets of one kind (`hardware`, `model`, `pd-cluster`), sorted."""
    folder = resources.files("dualpath.presets") / kind
    if not folder.is_dir():
        return []
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def load_document(
    kind: str, name_or_path: str, *, _depth: int = 0, _base_dir: Path | None = None
) -> dict[str, Any]:
    """The TOML table of a preset or file, with `extends` resolved (merged over its base). A model may also
    be a Hugging Face model folder (its `config.json`, `dualpath.config.hf_model`)."""
    if kind == MODEL and is_model_folder(name_or_path) and Path(name_or_path).suffix != ".toml":
        return hf_model_document(name_or_path)
    if _depth > _MAX_EXTENDS_DEPTH:
        raise ConfigError(
            f"{kind} {name_or_path!r}: `extends` chain longer than {_MAX_EXTENDS_DEPTH} (a cycle?)"
        )
    try:
        text, base_dir = _read(kind, name_or_path, _base_dir)
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:  # its message ends "(at line L, column C)"
        raise ConfigError(f"{kind} {name_or_path!r} is not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{kind} {name_or_path!r} is not a UTF-8 text file: {error}") from None
    except OSError as error:
        raise ConfigError(f"{kind} {name_or_path!r}: cannot read: {error.strerror}") from None
    parent = doc.pop("extends", None)
    if parent is None:
        return doc
    if not isinstance(parent, str):
        raise ConfigError(f"{kind} {name_or_path!r}: extends = {parent!r}; expected a preset name or path")
    base = load_document(kind, parent, _depth=_depth + 1, _base_dir=base_dir)
    return merge(base, doc)


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` over `base`, recursing into tables present in both."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_hardware(name_or_path: str = DEFAULT_HARDWARE, overrides: Iterable[str] = ()) -> HardwareSpec:
    spec = build(HardwareSpec, load_document(HARDWARE, name_or_path), path="")
    return _checked(apply_overrides(spec, overrides))


def load_model(name_or_path: str = DEFAULT_MODEL, overrides: Iterable[str] = ()) -> ModelSpec:
    spec = build(ModelSpec, load_document(MODEL, name_or_path), path="")
    return _checked(apply_overrides(spec, overrides))


def load_cluster(
    name_or_path: str | None = None,
    *,
    hardware: str | None = None,
    model: str | None = None,
    num_prefill_nodes: int | None = None,
    num_decode_nodes: int | None = None,
    overrides: Iterable[str] = (),
) -> ClusterSpec:
    """A ClusterSpec from a `pd-cluster` preset/file, or from hardware + model names alone.

    Keyword arguments (the CLI's `--hardware/--model/--p/--d`) win over the document; `overrides`
    (`hardware.cnic_bytes_per_s=200Gbps`, `num_decode_nodes=4`) are applied last.
    """
    doc = load_document(PD_CLUSTER, name_or_path) if name_or_path else {}
    hardware_doc = _part(HARDWARE, doc.pop("hardware", DEFAULT_HARDWARE), hardware)
    model_doc = _part(MODEL, doc.pop("model", DEFAULT_MODEL), model)
    doc.setdefault("num_prefill_nodes", 1)
    doc.setdefault("num_decode_nodes", 1)
    if num_prefill_nodes is not None:
        doc["num_prefill_nodes"] = num_prefill_nodes
    if num_decode_nodes is not None:
        doc["num_decode_nodes"] = num_decode_nodes
    doc["hardware"] = build(HardwareSpec, hardware_doc, path="hardware")
    doc["model"] = build(ModelSpec, model_doc, path="model")
    spec = build(ClusterSpec, doc, path="")
    return _checked(apply_overrides(spec, overrides))


def apply_overrides(spec: S, overrides: Iterable[str]) -> S:
    """Apply `a.b=value` items in order; values are parsed with the field's unit (e.g. `=200Gbps`)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"override {item!r}: expected KEY=VALUE, e.g. hardware.snic_bytes_per_s=200Gbps"
            )
        spec = _replace_path(spec, key.strip().split("."), value.strip(), full_key=key.strip())
    return spec


def spec_to_dict(spec: object) -> dict[str, Any]:
    """Plain nested dict of a spec (base SI units), for JSON output."""
    return dataclasses.asdict(spec)  # type: ignore[call-overload, no-any-return]


def _replace_path(spec: S, parts: list[str], value: str, *, full_key: str) -> S:
    known = {f.name for f in dataclasses.fields(spec)}
    head = parts[0]
    if head not in known:
        raise ConfigError(
            f"unknown key {full_key!r} (no field {head!r} in {type(spec).__name__}); "
            f"expected one of: {', '.join(sorted(known))}"
        )
    current = getattr(spec, head)
    if len(parts) > 1:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"unknown key {full_key!r}: {head!r} is a value, not a table")
        new_value: Any = _replace_path(current, parts[1:], value, full_key=full_key)  # type: ignore[type-var]
    else:
        hint = typing.get_type_hints(type(spec))[head]
        if dataclasses.is_dataclass(hint):
            raise ConfigError(
                f"override {full_key!r} names a table; set one of its fields, e.g. {full_key}.name=..."
            )
        new_value = coerce_field(hint, head, value, path=full_key)
    return dataclasses.replace(spec, **{head: new_value})


def _part(kind: str, in_doc: Any, cli_name: str | None) -> dict[str, Any]:
    """A cluster's hardware/model: a preset name, or a table with `extends` plus overriding fields."""
    if cli_name is not None:
        return load_document(kind, cli_name)
    if isinstance(in_doc, str):
        return load_document(kind, in_doc)
    if isinstance(in_doc, Mapping):
        table = dict(in_doc)
        parent = table.pop("extends", None)
        return merge(load_document(kind, parent), table) if isinstance(parent, str) else table
    raise ConfigError(f"{kind} = {in_doc!r}: expected a preset name or a table with `extends`")


def _read(kind: str, name_or_path: str, base_dir: Path | None) -> tuple[str, Path | None]:
    path = Path(name_or_path)
    if base_dir is not None and not path.is_absolute() and (base_dir / path).is_file():
        path = base_dir / path
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise ConfigError(f"no {kind} file {name_or_path!r}")
        return path.read_text(), path.parent
    names = preset_names(kind)
    if name_or_path not in names:
        raise ConfigError(
            f"unknown {kind} preset {name_or_path!r}; choose one of {', '.join(names)} or a .toml file"
        )
    return (resources.files("dualpath.presets") / kind / f"{name_or_path}.toml").read_text(), None


def _checked(spec: S) -> S:
    validate(spec)
    return spec
