# The two commands of README.md: `make demo` and `make test`.
# Both create .venv on first use and reinstall only when setup.cfg changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test bench clean xmllint chromium

demo: $(INSTALLED)
	$(BIN)/python scripts/demo.py

# The xmllint test (tests/test_xml_payload.py) needs libxml2-utils; install it
# when we can (root with apt-get, as in CI), or say plainly that it will skip.
test: $(INSTALLED) xmllint chromium
	$(BIN)/python -m pytest

xmllint:
	@command -v xmllint >/dev/null && exit 0; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "xmllint is missing: installing libxml2-utils with apt-get"; \
		apt-get install -y -qq libxml2-utils >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libxml2-utils >/dev/null 2>&1; } || \
		echo "could not install libxml2-utils: the xmllint test will skip"; \
	else \
		echo "xmllint is missing and apt-get (as root) is not available: the xmllint test will skip"; \
	fi

# The history report test (tests/test_history_report.py) opens report.html in
# headless Chromium; installed the same way, or that test skips saying why.
chromium:
	@command -v chromium >/dev/null && exit 0; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "chromium is missing: installing it with apt-get"; \
		apt-get install -y -qq chromium >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } || \
		echo "could not install chromium: the report.html test will skip"; \
	else \
		echo "chromium is missing and apt-get (as root) is not available: the report.html test will skip"; \
	fi

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
