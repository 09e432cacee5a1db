"""Fixtures shared by every test folder."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_script() -> Callable[[str], ModuleType]:
    """A loader of `benchmarks/<name>.py` as a module (the scripts are files, not a package)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def ran_in_pure_python(request: pytest.FixtureRequest) -> bool:
    """For a test that subclasses or patches the simulator driver, which the native build compiles (a
    compiled class takes no interpreted subclass and no instance patch): under that build, run this same
    test in a child process on the pure-Python source, assert it passed there, and return True so that the
    caller returns; on the pure-Python source, return False and let the test run here."""
    from dualpath import native

    if native.pure_python_requested() or "dualpath.sim.driver" not in native.compiled_modules():
        return False
    env = {**os.environ, native.PURE_PYTHON_ENV: "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid]
    child = subprocess.run(
        command, cwd=request.config.rootpath, env=env, capture_output=True, text=True, timeout=600
    )
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    return True
