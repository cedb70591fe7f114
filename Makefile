# The two commands of README.md: `make demo` and `make test`.
# Both create .venv on first use and reinstall only when setup.cfg changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test bench clean

demo: $(INSTALLED)
	$(BIN)/python scripts/demo.py

test: $(INSTALLED)
	$(BIN)/python -m pytest

bench: $(INSTALLED)
	$(BIN)/python scripts/bench.py

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "agentbus needs Python 3.10 or newer"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One environment for both: the demo's history report needs pyspark (the
# `spark` extra), the tests need pytest and hypothesis (`dev`) and test Spark too.
$(INSTALLED): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info demo
