"""Which modules run as native code (mypyc), and the switch back to the pure-Python source.

NOTE: `pip install -e .` (what `make` runs) compiles `NATIVE_MODULES` with mypyc when mypyc and a C
compiler are present (setup.py); the `.py` files stay the truth and the compiled `.so` files sit
beside them. Python's import prefers an extension module over a source file, so a `.py` edited after
the build would silently run the old `.so`. Importing this module therefore routes all of them to
their `.py` when `DUALPATH_PURE_PYTHON=1` is set or when any `.py` is newer than its `.so` (stale; one
line on stderr says so, and `make` rebuilds). The package's `__init__` imports it, so it runs before any
subpackage can load a compiled module. It is build plumbing, not part of the sans-I/O core: it reads an
environment variable and file times, and adds an import hook to the interpreter.
docs/simulator-native.md has the measurements behind the list.

Stdlib only: setup.py reads `NATIVE_MODULES` from this file before the package is installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The simulator's hot path whose compiled build cut CPU time with identical results
# (docs/simulator-native.md). Interpreted on purpose: package __init__ files and this module.
NATIVE_MODULES: tuple[str, ...] = (
    "dualpath.request",
    "dualpath.policy.types",
    "dualpath.policy.fifo",
    "dualpath.policy.traffic",
    "dualpath.policy.decisions",
    "dualpath.policy.batching",
    "dualpath.policy.read_path",
    "dualpath.policy.pe_assign",
    "dualpath.policy.de_assign",
    "dualpath.policy.scheduler",
    "dualpath.engine.commands",
    "dualpath.engine.buffers",
    "dualpath.engine.modes",
    "dualpath.engine.pipeline",
    "dualpath.engine.storage_reader",
    "dualpath.engine.prefill",
    "dualpath.engine.decode",
    "dualpath.engine.core",
    "dualpath.sim.links_fill",
    "dualpath.sim.links",
    "dualpath.sim.kernel",
    "dualpath.architecture.arch",
    "dualpath.sim.cost_kernels",
    "dualpath.sim.cost",
    "dualpath.sim.rates",
    "dualpath.sim.topology",
    "dualpath.sim.agents",
    "dualpath.sim.driver",
)

PURE_PYTHON_ENV = "DUALPATH_PURE_PYTHON"


def pure_python_requested() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


# The profile-guided build's stage, `generate` or `use`: native_pgo.py sets it for setup.py, which adds
# GCC's flags for that stage (docs/simulator-native.md).
PROFILE_ENV = "DUALPATH_NATIVE_PROFILE"


def c_compiler() -> str:
    """The C compiler this interpreter builds extension modules with (its `CC`, first word)."""
    return (sysconfig.get_config_var("CC") or "cc").split()[0]


def is_gcc(compiler: str) -> bool:
    """Whether `compiler` is GCC, the one compiler whose profile-guided flags the build knows."""
    return "gcc" in Path(compiler).name


def _source(name: str) -> Path:
    return Path(__file__).resolve().parents[1].joinpath(*name.split(".")).with_suffix(".py")


def _extension(name: str) -> Path | None:
    source = _source(name)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def stale_modules() -> list[str]:
    """Modules whose `.so` is older than their `.py` (an edit since the last build)."""
    stale = []
    for name in NATIVE_MODULES:
        ext = _extension(name)
        if ext is not None and _source(name).stat().st_mtime > ext.stat().st_mtime:
            stale.append(name)
    return stale


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the listed modules from their `.py`, ahead of the `.so` beside them."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, _source(fullname))


def use_source_where_needed() -> None:
    """Route pure-Python-requested or stale modules to their source (module NOTE). Idempotent."""
    stale = [] if pure_python_requested() else stale_modules()
    if not (pure_python_requested() or stale):
        return
    # All of them, not only the stale ones: compiled modules of one build call each other's C
    # functions directly, so a fresh .py beside an old .so of its caller would still run old code.
    names = [n for n in NATIVE_MODULES if _extension(n) is not None and n not in sys.modules]
    if not names or any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    if stale:
        print(
            f"dualpath: native build is older than {', '.join(stale)}; running the simulator's .py "
            "(run `make` or `pip install -e .` to rebuild)",
            file=sys.stderr,
        )
    # sys.meta_path is the interpreter's own import hook list: the one place that can put the
    # source ahead of the extension module for these names.
    sys.meta_path.insert(0, _SourceFinder(names))


def compiled_modules() -> list[str]:
    """The `NATIVE_MODULES` that this process runs as native code (imports them)."""
    compiled = []
    for name in NATIVE_MODULES:
        module = importlib.import_module(name)
        if any(str(module.__file__).endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES):
            compiled.append(name)
    return compiled


def describe() -> str:
    """One line: which build this process runs (printed by `make` after installing)."""
    compiled = compiled_modules()
    if compiled:
        return f"dualpath simulator: native build ({len(compiled)}/{len(NATIVE_MODULES)} modules compiled with mypyc)"
    why = f" ({PURE_PYTHON_ENV} set)" if pure_python_requested() else ""
    return f"dualpath simulator: pure Python{why}"


# On import (module NOTE): before `policy`, `engine` or `sim` load any compiled module.
use_source_where_needed()
