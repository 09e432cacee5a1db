"""`dualpath config`: list presets and show resolved configs with units."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "config", help="list presets, show a resolved config", description="Presets and resolved configs."
    )
    actions = parser.add_subparsers(dest="config_command", metavar="ACTION")
    show = actions.add_parser(
        "show", help="print resolved presets (hardware, model or pd-cluster) with units"
    )
    show.add_argument("presets", nargs="*", metavar="PRESET", help="preset names or .toml files")
    show.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    show.add_argument("--json", action="store_true", help="JSON in base SI units")
    show.set_defaults(func=run_show)
    listing = actions.add_parser("list", help="list the packaged presets")
    listing.set_defaults(func=run_list)
    parser.set_defaults(func=run_list)
    return parser


def run_list(args: argparse.Namespace) -> int:
    from dualpath.config.loader import HARDWARE, MODEL, PD_CLUSTER, preset_names

    for kind in (HARDWARE, MODEL, PD_CLUSTER, "cluster"):
        print(f"{kind + ':':12} {' '.join(preset_names(kind))}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from dualpath.cli.main import UserError
    from dualpath.config.coerce import ConfigError
    from dualpath.units import UnitError

    try:
        shown = [_resolve(name, args.set) for name in args.presets or [None]]
    except (ConfigError, UnitError) as error:
        raise UserError(str(error)) from None
    if args.json:
        payload = shown[0] if len(shown) == 1 else shown
        print(json.dumps(payload, indent=2))
    else:
        print("\n\n".join(_render(item) for item in shown))
    return 0


def _resolve(name: str | None, overrides: list[str]) -> dict[str, Any]:
    """{"kind", "name", "config", "derived"} for a preset name or file; None means the default cluster."""
    from dualpath.config import loader

    if name is None:
        spec: Any = loader.load_cluster(overrides=overrides)
        return {
            "kind": loader.PD_CLUSTER,
            "name": "(default)",
            "config": loader.spec_to_dict(spec),
            "derived": {},
        }
    kind = _kind_of(name)
    if kind == "cluster":  # the runtime's process layouts: shown as written, read by dualpath.runtime
        doc = loader.load_document("cluster", name)
        return {"kind": kind, "name": name, "config": doc, "derived": {}}
    if kind == loader.HARDWARE:
        spec = loader.load_hardware(name, overrides)
    elif kind == loader.MODEL:
        spec = loader.load_model(name, overrides)
    else:
        spec = loader.load_cluster(name, overrides=overrides)
    derived = _model_derived(spec) if kind == loader.MODEL else {}
    return {"kind": kind, "name": name, "config": loader.spec_to_dict(spec), "derived": derived}


def _kind_of(name: str) -> str:
    import tomllib
    from pathlib import Path

    from dualpath.config import loader
    from dualpath.config.coerce import ConfigError

    for kind in (loader.HARDWARE, loader.MODEL, loader.PD_CLUSTER, "cluster"):
        if name in loader.preset_names(kind):
            return kind
    path = Path(name)
    if not path.is_file():
        every = [
            n for k in (loader.HARDWARE, loader.MODEL, loader.PD_CLUSTER) for n in loader.preset_names(k)
        ]
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(every)} or a .toml file")
    doc = tomllib.loads(path.read_text())
    if "gpu" in doc or "gpus_per_node" in doc:
        return loader.HARDWARE
    if "attention" in doc or "num_layers" in doc:
        return loader.MODEL
    return loader.PD_CLUSTER


def _model_derived(m: Any) -> dict[str, float]:
    from dualpath.architecture import arch

    return {
        "kv_bytes_per_token_per_layer": arch.kv_bytes_per_token_per_layer(m),
        "kv_bytes_per_token": arch.kv_bytes_per_token(m),
        "full_block_bytes_64_tokens": arch.full_block_bytes(m, 64),
        "total_params": arch.total_params(m),
        "active_params_per_token": arch.active_params_per_token(m),
        "weight_bytes": arch.weight_bytes(m),
        "linear_flops_per_token": arch.linear_flops_per_token_all_layers(m),
    }


def _render(item: dict[str, Any]) -> str:
    lines = [f"# {item['kind']} {item['name']}"]
    lines += _render_table(item["config"], prefix="")
    if item["derived"]:
        lines.append("# derived from the architecture (dualpath.architecture.arch)")
        lines += _render_table(item["derived"], prefix="")
    return "\n".join(lines)


def _render_table(table: dict[str, Any], prefix: str) -> list[str]:
    lines: list[str] = []
    for key, value in table.items():
        if isinstance(value, dict):
            lines += _render_table(value, prefix=f"{prefix}{key}.")
        else:
            lines.append(f"{prefix}{key} = {_human(key, value)}")
    return lines


def _human(key: str, value: Any) -> str:
    from dualpath import units

    if isinstance(value, bool) or not isinstance(value, int | float):
        return json.dumps(value)
    if key.endswith("_bytes_per_s"):
        return units.format_rate(value)
    if key.endswith("_flops_per_s"):
        return units.format_flops_rate(value)
    if key.endswith("_bytes"):
        shortest = min(units.format_bytes(value), units.format_bytes(value, binary=False), key=len)
        return f"{shortest} ({value:,.0f} B)"
    if key.endswith("_s"):
        return units.format_duration(value)
    if key.endswith(("_params", "_params_per_token")) or key.endswith("flops_per_token"):
        return f"{value / 1e9:,.2f}e9"
    return f"{value:g}" if isinstance(value, float) else str(value)
