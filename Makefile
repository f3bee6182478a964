# The two quick-start commands: `make serve` (install everything into .venv, serve the embedded
# demo model) and `make test` (the whole test suite). CI runs .ci/run: `make lint-ci test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU-installable plugins get their dependencies; the GPU plugins install without theirs
# (flashinfer-python, flash-attn) so a CPU machine stays light; their imports are lazy.
GPU_PLUGINS := plugins/attention/fi plugins/attention/fa3
CPU_PLUGINS := $(filter-out $(GPU_PLUGINS),$(patsubst %/pyproject.toml,%,$(wildcard plugins/*/*/pyproject.toml)))
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install serve test lint lint-ci
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt $(wildcard plugins/*/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,shell,bench]' $(addprefix -e ,$(CPU_PLUGINS))
	$(BIN)/python -m pip install -q --no-deps $(addprefix -e ,$(wildcard $(GPU_PLUGINS)))
	touch $@

serve: install
	$(BIN)/minisgl serve $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Paths and rules live in pyproject.toml ([tool.ruff], [tool.importlinter]).
lint: lint-ci
	$(BIN)/ruff format --check

# What CI runs until the tree is formatted once (then .ci/run calls `make lint` instead).
lint-ci: install
	$(BIN)/ruff check
	$(BIN)/lint-imports
