# The two commands a newcomer needs: `make demo` (the main job on the embedded default) and `make test`.
# Both create or refresh .venv and install what they need, so they work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck check slow clean venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned in pyproject; installing it first lets pip take the CPU build on this machine's disk.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
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
	rm -rf $(VENV) build *.egg-info
