"""Profile-guided native build of the simulator's hot path (docs/simulator-native.md); `make` runs it.

1. compile the native modules instrumented (setup.py with DUALPATH_NATIVE_PROFILE=generate);
2. run `TRAINING`, short simulations in the modes and cluster sizes `dualpath simulate` and `advise` run,
   with that build: GCC records which branches and calls the hot path takes;
3. compile again with that profile (DUALPATH_NATIVE_PROFILE=use): the same C source, its machine code
   laid out and inlined for those paths.

Results are identical (the same C code; `tests/sim/test_native.py` compares pure and native runs); the
speed it buys is measured in benchmarks/README.md. GCC only: with another compiler, or if a step fails,
the plain native build is made instead and one line says so; with DUALPATH_PURE_PYTHON set nothing is
built. Usage: python native_pgo.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dualpath import native  # installed by pip before this runs (Makefile)

HERE = Path(__file__).resolve().parent

# DS-V3.2 on hopper-8x400g, 64K trajectories (the acceptance runs' model and dataset), offline: the
# DualPath, Basic and Oracle paths, a 4P8D cluster, and the small model `advise` is checked on. ≈ 15 s
# with the instrumented build on a 2-core machine.
_DS = ["--hardware", "hopper-8x400g", "--model", "deepseek-v3.2", "--dataset", "64k"]
TRAINING: tuple[list[str], ...] = (
    [*_DS, "--p", "2", "--d", "4", "--agents", "512", "--mode", "dualpath"],
    [*_DS, "--p", "2", "--d", "4", "--agents", "256", "--mode", "basic"],
    [*_DS, "--p", "2", "--d", "4", "--agents", "256", "--mode", "oracle"],
    [*_DS, "--p", "4", "--d", "8", "--agents", "512", "--mode", "dualpath"],
    ["--hardware", "hopper-8x400g", "--model", "ds-27b", "--dataset", "64k", "--p", "1", "--d", "1",
     "--agents", "256", "--mode", "basic"],
)  # fmt: skip


def _say(line: str) -> None:
    print(f"dualpath native build: {line}", file=sys.stderr, flush=True)


def _build(stage: str | None) -> None:
    """setup.py's extensions, rebuilt in place (`stage`: the profile-guided stage, None: plain)."""
    env = {k: v for k, v in os.environ.items() if k != native.PROFILE_ENV}
    if stage is not None:
        env[native.PROFILE_ENV] = stage
    command = [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"]
    subprocess.run(command, cwd=HERE, env=env, check=True, stdout=subprocess.DEVNULL)


def _train() -> None:
    """Each training run in its own process, which must exit normally: GCC writes the profile at exit
    (`dualpath.cli.main.main` returns, where the console script would end the process at once)."""
    code = "import sys; from dualpath.cli.main import main; sys.exit(main(sys.argv[1:]))"
    for args in TRAINING:
        command = [sys.executable, "-c", code, "simulate", *args, "--json", "--quiet"]
        subprocess.run(command, cwd=HERE, check=True, stdout=subprocess.DEVNULL)


def _clear_profile() -> None:
    """An older profile would be merged into the new one (the counters add up): start from none."""
    for old in (HERE / "build").rglob("*.gcda"):
        old.unlink()


def _native_built() -> bool:
    return any((HERE / "src").glob("*__mypyc.*.so"))


def main() -> int:
    if native.pure_python_requested():
        _say(f"nothing to build ({native.PURE_PYTHON_ENV} is set)")
        return 0
    compiler = native.c_compiler()
    if not native.is_gcc(compiler):
        _say(f"plain build (the compiler {compiler!r} is not GCC: no profile-guided stage)")
        _build(None)
        return 0
    start = time.monotonic()
    try:
        _clear_profile()
        _build("generate")
        if not _native_built():  # setup.py fell back to pure Python and said why: try the plain build
            _build(None)
            return 0
        _say(f"training the profile ({len(TRAINING)} simulations, instrumented build)")
        _train()
        _build("use")
    except (subprocess.CalledProcessError, OSError) as error:
        _say(f"plain build instead of the profile-guided one ({error})")
        _build(None)
        return 0
    _say(f"profile-guided build done in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
