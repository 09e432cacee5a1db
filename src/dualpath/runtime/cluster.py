"""The runtime's cluster description: which processes to start and how fast their emulated links are.

Presets are TOML files in `dualpath/presets/cluster/` (e.g. `local-1p2d`). Every bandwidth here is an
*emulation*: a real rate limiter in the node process stands in for an RDMA NIC (brief §3, DESIGN §4).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

from dualpath.policy.read_path import READ_PATH_POLICIES

MODES = ("basic", "layerwise", "dualpath-rr", "dualpath", "oracle")
ROLES = ("prefill", "decode")
DTYPES = ("", "float32", "bfloat16", "float16")  # "": the model's own
# A torch device string (`cpu`, `cuda`, `cuda:1`, ...), checked before any node starts: a typo fails
# `serve` at once instead of in every node process.
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|hpu|meta)(:[0-9]+)?")


class ClusterConfigError(ValueError):
    """A cluster file or preset that cannot be used; the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class RuntimeClusterSpec:
    """A local (or multi-host) runtime cluster: P prefill nodes, D decode nodes, emulated links."""

    name: str = "local-1p2d"
    model: str = "tiny-llama"  # a model preset name, or a Hugging Face model folder (every node loads it)
    dtype: str = ""  # float32, bfloat16, float16; empty: the preset's KV format, or the folder's torch_dtype
    device: str = "cpu"
    num_prefill_nodes: int = 1
    num_decode_nodes: int = 2
    engines_per_node: int = 1
    mode: str = "dualpath"
    read_path: str = ""  # empty: the mode's own read-path policy (dualpath: shorter-queue, §6.3)
    block_tokens: int = 16
    seed: int = 0
    snic_bytes_per_s: float = 16e6
    cnic_bytes_per_s: float = 128e6
    dram_buffer_bytes: int = 256 * 2**20
    hbm_tokens: int = 65536  # a DE's KV-cache capacity in tokens (its "HBM"; tiny-llama: 256 MiB)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ClusterConfigError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.read_path and self.read_path not in READ_PATH_POLICIES:
            raise ClusterConfigError(
                f"read_path {self.read_path!r} is not one of {', '.join(sorted(READ_PATH_POLICIES))}"
            )
        if not _DEVICE.fullmatch(self.device):
            raise ClusterConfigError(f"device {self.device!r} is not a device name (cpu, cuda, cuda:1, ...)")
        if self.num_prefill_nodes < 1 or self.num_decode_nodes < 1:
            raise ClusterConfigError("a cluster needs at least one prefill node and one decode node")
        if self.engines_per_node != 1:
            raise ClusterConfigError("the runtime runs one engine per node process (engines_per_node = 1)")
        if self.block_tokens < 1:
            raise ClusterConfigError("block_tokens must be at least 1")
        if self.dtype not in DTYPES:
            raise ClusterConfigError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES[1:])}")
        for name in ("snic_bytes_per_s", "cnic_bytes_per_s", "dram_buffer_bytes", "hbm_tokens"):
            if getattr(self, name) <= 0:
                raise ClusterConfigError(f"{name} must be positive")

    def node_ids(self) -> list[tuple[str, str]]:
        """(node_id, role) for every node, prefill nodes first; ids are stable across runs."""
        pes = [(f"p{i}", "prefill") for i in range(self.num_prefill_nodes)]
        des = [(f"d{i}", "decode") for i in range(self.num_decode_nodes)]
        return pes + des

    def with_mode(self, mode: str) -> RuntimeClusterSpec:
        return replace(self, mode=mode)


def preset_names() -> list[str]:
    folder = resources.files("dualpath.presets") / "cluster"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def load_cluster(name_or_path: str) -> RuntimeClusterSpec:
    """A preset name (`local-1p2d`) or a TOML file path; unknown keys are errors."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ClusterConfigError(f"no cluster file {name_or_path!r}")
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise ClusterConfigError(f"{name_or_path}: cannot read: {error.strerror}") from None
    else:
        if name_or_path not in preset_names():
            raise ClusterConfigError(
                f"unknown cluster preset {name_or_path!r}; choose one of {', '.join(preset_names())} or a .toml file"
            )
        raw = (resources.files("dualpath.presets") / "cluster" / f"{name_or_path}.toml").read_bytes()
    try:
        data = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as error:  # its message ends "(at line L, column C)"
        raise ClusterConfigError(f"{name_or_path}: not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ClusterConfigError(f"{name_or_path}: not a UTF-8 text file: {error}") from None
    return cluster_from_toml(data)


def cluster_from_toml(data: dict[str, object]) -> RuntimeClusterSpec:
    known = {f.name for f in fields(RuntimeClusterSpec)}
    values: dict[str, object] = {}
    for section in ("cluster", "links"):
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ClusterConfigError(f"[{section}] must be a table")
        for key, value in table.items():
            if key not in known:
                raise ClusterConfigError(
                    f"unknown key {key!r} in [{section}]; known keys: {', '.join(sorted(known))}"
                )
            values[key] = value
    extra = set(data) - {"cluster", "links"}
    if extra:
        raise ClusterConfigError(f"unknown section(s) {sorted(extra)}; use [cluster] and [links]")
    return _build({k: coerce_value(k, v) for k, v in values.items()})


def _build(values: dict[str, object]) -> RuntimeClusterSpec:
    try:
        return RuntimeClusterSpec(**values)  # type: ignore[arg-type]
    except TypeError as error:
        raise ClusterConfigError(str(error)) from error


def coerce_value(key: str, value: object) -> object:
    """Human units at the edge ("16MB/s", "256MiB"); integers where the field is an integer."""
    from dualpath.units import parse_bandwidth, parse_bytes

    try:
        if key.endswith("_bytes_per_s"):
            return parse_bandwidth(value)  # type: ignore[arg-type]
        if key.endswith("_bytes"):
            return int(parse_bytes(value))  # type: ignore[arg-type]
        if key in _INT_FIELDS:
            return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError) as error:
        raise ClusterConfigError(f"{key} = {value!r}: {error}") from None
    return value


_INT_FIELDS = (
    "num_prefill_nodes",
    "num_decode_nodes",
    "engines_per_node",
    "block_tokens",
    "seed",
    "hbm_tokens",
)


def apply_settings(spec: RuntimeClusterSpec, settings: list[str]) -> RuntimeClusterSpec:
    """`KEY=VALUE` overrides (`dualpath serve --set snic_bytes_per_s=8MB/s`)."""
    known = {f.name for f in fields(RuntimeClusterSpec)}
    values = {f.name: getattr(spec, f.name) for f in fields(RuntimeClusterSpec)}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise ClusterConfigError(
                f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}"
            )
        values[key] = coerce_value(key, value)
    return _build(values)


def dump_cluster(spec: RuntimeClusterSpec) -> str:
    """The resolved spec as a cluster file (what `serve` hands its nodes, overrides included)."""
    lines = ["[cluster]"]
    for f in fields(RuntimeClusterSpec):
        value = getattr(spec, f.name)
        lines.append(f"{f.name} = {value!r}" if not isinstance(value, str) else f'{f.name} = "{value}"')
    return "\n".join(lines) + "\n"
