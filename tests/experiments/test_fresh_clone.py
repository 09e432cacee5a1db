"""A fresh clone stands on its own: from a `git clone` into a folder with nothing beside it (no `../shared`),
on the clone's own source, every shipped sweep spec and every preset parses, and `dualpath sweep mooncake`
lists its runs. A shipped file that names a path outside the repository fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# Run in the clone, on its source (PYTHONPATH), pure Python (a clone has no native build).
PARSE_EVERYTHING = """
import json, sys
from pathlib import Path

import dualpath
from dualpath.config.loader import HARDWARE, MODEL, PD_CLUSTER, load_cluster, load_hardware, load_model, preset_names
from dualpath.experiments.sweep import load_sweep, shipped_specs
from dualpath.runtime import cluster as runtime_cluster

clone, out = Path.cwd().resolve(), Path(sys.argv[1])
source = Path(dualpath.__file__).resolve()
assert source.is_relative_to(clone), f"imported {source}, not the clone's source"
runs = {name: len(load_sweep(path, trace_dir=out / "traces").runs) for name, path in shipped_specs().items()}
loaders = {HARDWARE: load_hardware, MODEL: load_model, PD_CLUSTER: load_cluster}
presets = {kind: [loaders[kind](name) and name for name in preset_names(kind)] for kind in loaders}
presets["runtime-cluster"] = [runtime_cluster.load_cluster(name) and name for name in runtime_cluster.preset_names()]
print(json.dumps({"runs": runs, "presets": presets}))
"""


def repository_root() -> Path | None:
    found = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=HERE, capture_output=True, text=True)
    return Path(found.stdout.strip()) if found.returncode == 0 else None


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = repository_root()
    if root is None:
        pytest.skip("the tests do not run from a git checkout, so there is nothing to clone")
    target = tmp_path_factory.mktemp("alone") / "dualpath"
    subprocess.run(["git", "clone", "-q", str(root), str(target)], check=True, timeout=120)
    assert not (target.parent / "shared").exists()
    return target


def run_in(clone: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(clone / "src"), "DUALPATH_PURE_PYTHON": "1"}
    return subprocess.run(
        [sys.executable, *argv], cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )


def test_every_shipped_spec_and_preset_parses_in_a_clone_alone(clone: Path, tmp_path: Path) -> None:
    done = run_in(clone, "-c", PARSE_EVERYTHING, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout)
    assert "mooncake" in parsed["runs"] and all(n > 0 for n in parsed["runs"].values()), parsed["runs"]
    assert all(parsed["presets"].values()), parsed["presets"]


def test_sweep_mooncake_lists_its_runs_in_a_clone_alone(clone: Path, tmp_path: Path) -> None:
    done = run_in(clone, "-m", "dualpath.cli.main", "sweep", "mooncake", "--list", "-o", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dualpath" in done.stdout and "basic" in done.stdout
    assert list((tmp_path / "traces").glob("conversation_trace-*.trajectories.jsonl"))
