"""The optional native build (native.py, setup.py): which build ran, the pure-Python switch,
stale-build detection, and that both builds give the same results."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dualpath import native
from dualpath.cli.main import build_parser

SRC = Path(native.__file__).resolve().parents[1]
BUILT = any(native._extension(name) is not None for name in native.NATIVE_MODULES)
needs_build = pytest.mark.skipif(not BUILT, reason="no native build here (make / pip install -e . builds it)")


def python(code: str, *, pure: bool = False, src: Path = SRC) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_PYTHON_ENV}
    env["PYTHONPATH"] = str(src)
    if pure:
        env[native.PURE_PYTHON_ENV] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)


FILES = "import dualpath.sim.links as a, dualpath.engine.core as b; print(a.__file__); print(b.__file__)"


def simulate(*, pure: bool) -> dict[str, object]:
    argv = ["simulate", "--model", "ds-27b", "--p", "1", "--d", "1", "--agents", "4", "--json", "--quiet"]
    done = python(f"from dualpath.cli.main import main; main({argv!r})", pure=pure)
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_pure_python_switch_runs_the_source() -> None:
    done = python(FILES + "; from dualpath.native import describe; print(describe())", pure=True)
    links, core, line = done.stdout.splitlines()
    assert links.endswith("links.py") and core.endswith("core.py")
    assert "pure Python" in line


@needs_build
def test_built_tree_runs_the_compiled_modules() -> None:
    links, core = python(FILES).stdout.splitlines()
    assert links.endswith(".so") and core.endswith(".so")
    assert native.compiled_modules() == list(native.NATIVE_MODULES)


@needs_build
def test_simulate_json_says_which_build_ran_and_both_agree() -> None:
    compiled, pure = simulate(pure=False), simulate(pure=True)
    assert compiled.pop("compiled") is True and pure.pop("compiled") is False
    compiled.pop("sim_wall_s"), pure.pop("sim_wall_s")
    assert compiled == pure


@needs_build
def test_a_source_edited_after_the_build_runs_its_source(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(SRC / "dualpath", copy / "dualpath")
    for shared in SRC.glob("*__mypyc.*.so"):
        shutil.copy2(shared, copy / shared.name)
    edited = copy / "dualpath" / "sim" / "links_fill.py"
    later = max(so.stat().st_mtime for so in copy.rglob("*.so")) + 10.0
    os.utime(edited, (later, later))
    env = {k: v for k, v in os.environ.items() if k != native.PURE_PYTHON_ENV}
    env["PYTHONPATH"] = str(copy)
    done = subprocess.run([sys.executable, "-c", FILES], capture_output=True, text=True, env=env, check=True)
    links, core = done.stdout.splitlines()
    # All of them, not only the edited one: compiled callers would still call its old C code.
    assert links.endswith("links.py") and core.endswith("core.py")
    assert "older than dualpath.sim.links_fill" in done.stderr


def _native_pgo() -> ModuleType:
    """native_pgo.py (the repository root's build script), loaded from its file."""
    path = SRC.parent / "native_pgo.py"
    spec = importlib.util.spec_from_file_location("native_pgo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_guided_training_runs_are_valid_simulate_commands() -> None:
    """`make`'s profile-guided build trains on these runs; one the CLI refused would make every build
    fall back to the plain one (with one line saying so), so a renamed option must fail here."""
    pgo = _native_pgo()
    assert len(pgo.TRAINING) >= 3
    modes = set()
    for args in pgo.TRAINING:
        parsed = build_parser().parse_args(["simulate", *args, "--json", "--quiet"])
        modes.add(parsed.mode)
        assert parsed.agents <= 512  # the instrumented build runs them all: seconds each, not minutes
    assert {"dualpath", "basic", "oracle"} <= modes
