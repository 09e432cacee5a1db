"""Build hook: compile the simulator's hot modules with mypyc where possible (docs/simulator-native.md).

Everything else about the package is in pyproject.toml. The compiled build is optional: without mypyc,
without a C compiler, with DUALPATH_PURE_PYTHON=1 set, or when compiling fails, the package installs as
pure Python (the .py sources are the truth either way). One line on stderr says which (`pip -v` shows
it; `make` prints `dualpath.native.describe()` after installing).

DUALPATH_NATIVE_PROFILE=generate|use adds GCC's profile-guided optimisation flags: `native_pgo.py` (what
`make` runs) compiles instrumented, runs training simulations, and compiles again with their profile.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _native() -> ModuleType:
    """The package's own (stdlib-only) dualpath/native.py: NATIVE_MODULES, the pure-Python switch, the
    profile stage's variable and the compiler test, loaded from its file (the package is not installed yet)."""
    spec = importlib.util.spec_from_file_location("_dualpath_native", HERE / "src/dualpath/native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _say(line: str) -> None:
    print(f"dualpath build: {line}", file=sys.stderr)


# Plain C, no mypyc: pymalloc's arenas on huge pages for large simulations (sim/huge_pages.py).
HUGE_ARENAS = ("dualpath.sim._huge_arenas", "src/dualpath/sim/_huge_arenas.c")


def _pure(names: tuple[str, ...], why: str) -> list[Any]:
    """No extension modules; an earlier editable build's .so files go too, or they would still load."""
    for name in (*names, HUGE_ARENAS[0]):
        source = HERE.joinpath("src", *name.split(".")).with_suffix(".py")
        for old in source.parent.glob(f"{source.stem}.*.so"):
            old.unlink()
    for old in HERE.joinpath("src").glob("*__mypyc.*.so"):
        old.unlink()
    _say(f"pure Python ({why})")
    return []


# GCC's profile-guided optimisation (`native_pgo.py`): (compile flags, link flags) per stage. The profile
# (`.gcda` files) lands beside the instrumented build's object files in build/, where the `use` build of
# the same sources finds it; `-fprofile-update=single`: the simulator runs on one thread.
# `-fprofile-partial-training` (GCC >= 10): code the short training runs never reached (a large cluster's
# heap-based fill, a failure's re-plan, paths only a long run takes) is compiled for speed as without a
# profile, not for size in cold sections; measured faster at 2P4D 2,048 agents too (benchmarks/README.md).
PROFILE_FLAGS: dict[str, tuple[list[str], list[str]]] = {
    "generate": (["-fprofile-generate", "-fprofile-update=single"], ["-fprofile-generate"]),
    "use": (
        ["-fprofile-use", "-fprofile-partial-training", "-fprofile-correction", "-Wno-missing-profile"],
        ["-fprofile-use"],
    ),
}


# Every GCC build, plain or either profile stage (the stages must compile alike, or GCC refuses the
# profile): the extension's C functions are global symbols of a shared object, which GCC by default
# must assume another library could interpose, so it inlines none of them into another and assumes
# nothing across them. Nothing interposes them (Python reaches the module through its init function
# only); CPython builds its own library with this flag for the same reason. `-fno-plt`: a call into
# the interpreter (an object's allocation or freeing, a list's append) reads its address from the
# GOT instead of jumping through a PLT stub first. `-fno-stack-protector` drops the canary that the
# interpreter's own flags (`-fstack-protector-strong`) put in every function with a local array:
# the extension takes no untrusted input. Neither changes what any arithmetic computes (no
# `-march`: its fused multiply-adds would round differently). Measured in benchmarks/README.md.
GCC_FLAGS: list[str] = ["-fno-semantic-interposition", "-fno-plt", "-fno-stack-protector"]


def _gcc_flags(native: ModuleType, modules: list[Any], compiler: str) -> None:
    if not native.is_gcc(compiler):
        return
    for module in modules:
        module.extra_compile_args = [*module.extra_compile_args, *GCC_FLAGS]


def _profile_flags(native: ModuleType, modules: list[Any], compiler: str) -> None:
    """Add the profile stage's flags (`native.PROFILE_ENV`) to every extension (GCC only; any other
    value: refused)."""
    env = native.PROFILE_ENV
    stage = os.environ.get(env, "")
    if not stage:
        return
    if stage not in PROFILE_FLAGS:
        raise SystemExit(f"{env}={stage!r}: expected one of {sorted(PROFILE_FLAGS)}")
    if not native.is_gcc(compiler):
        _say(f"{env}={stage} ignored: the compiler {compiler!r} is not GCC")
        return
    compile_flags, link_flags = PROFILE_FLAGS[stage]
    for module in modules:
        module.extra_compile_args = [*module.extra_compile_args, *compile_flags]
        module.extra_link_args = [*module.extra_link_args, *link_flags]
    _say(f"profile-guided stage {stage!r}: {' '.join(compile_flags)}")


def ext_modules() -> list[Any]:
    native = _native()
    names = native.NATIVE_MODULES
    if native.pure_python_requested():
        return _pure(names, f"{native.PURE_PYTHON_ENV} is set")
    try:
        from mypyc.build import mypycify
    except ImportError:
        return _pure(names, "mypyc is not installed")
    compiler = native.c_compiler()
    if shutil.which(compiler) is None:
        return _pure(names, f"no C compiler {compiler!r}")
    paths = [str(Path("src", *name.split(".")).with_suffix(".py")) for name in names]
    try:
        modules: list[Any] = mypycify(paths, opt_level="3")
    except (Exception, SystemExit) as error:  # a mypyc type error exits: still install, as pure Python
        return _pure(names, f"mypyc failed: {error}")
    _gcc_flags(native, modules, compiler)
    _profile_flags(native, modules, compiler)
    _say(f"compiling {len(names)} modules with mypyc (dualpath/native.py NATIVE_MODULES)")
    return [*modules, Extension(HUGE_ARENAS[0], [HUGE_ARENAS[1]])]


class OptionalBuildExt(build_ext):
    """A C compiler that fails leaves a pure-Python install, not a failed one."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:
            _say(f"pure Python (C build failed: {error})")


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
