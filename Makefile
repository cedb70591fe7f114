# The two commands of README.md: `make demo` and `make test` (and `make docs`, the site;
# `make check`, the fast tier for the inner loop). Each creates .venv on first use and
# reinstalls only when setup.cfg changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test test-steps check check-steps bench docs clean tools check-tools clients

demo: $(INSTALLED)
	$(BIN)/python scripts/demo.py

# Some tests drive a program: xmllint (libxml2-utils) checks our XSDs,
# tmux runs `bus top` in a real terminal, chromium loads `bus serve`'s page and
# the history report's report.html.
# Install each one we can (root with apt-get, as in CI), or say plainly that
# its tests will skip.
TOOLS := xmllint:libxml2-utils tmux:tmux chromium:chromium

# `make test` and `make check` end with their wall time, setup included: the target runs
# its steps in a sub-make and says how long they took, whether they passed or not.
TIMED = start=$$(date +%s); $(MAKE) --no-print-directory $@-steps; status=$$?; \
	took=$$(( $$(date +%s) - start )); \
	printf 'make %s: %dm%02ds wall time, setup included\n' $@ $$((took / 60)) $$((took % 60)); \
	exit $$status

# Everything, as CI runs it (.ci/run).
test:
	+@$(TIMED)

test-steps: $(INSTALLED) tools clients
	$(BIN)/python -m pytest

# The fast tier for the inner loop: everything but the heavy tests, those that need Spark,
# Chromium, the agents' real clients (npm), a wheel build or a real Litestream or
# nats-server (tests/conftest.py marks them `heavy` from what each test reaches), and the
# `slow` ones, the multi-process crash and race campaigns that `make test` runs. It runs
# on CHECK_JOBS processes (pytest-xdist: most tests wait on child processes, so three share
# two cores well) and each property on fewer examples (conftest.py's "check" profile).
# Three on two cores: 2m40s, against 3m24s with two (2026-11-29, load ~1.6 and ~0.7).
CHECK_JOBS ?= 3
check:
	+@$(TIMED)

check-steps: $(INSTALLED) check-tools
	$(BIN)/python -m pytest -m "not heavy and not slow" -n $(CHECK_JOBS) --hypothesis-profile=check

check-tools:
	@$(MAKE) --no-print-directory tools TOOLS="$(filter-out chromium:%,$(TOOLS))"

tools:
	@for pair in $(TOOLS); do \
		tool=$${pair%%:*}; package=$${pair#*:}; \
		command -v $$tool >/dev/null && continue; \
		if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
			echo "$$tool is missing: installing $$package with apt-get"; \
			apt-get install -y -qq $$package >/dev/null 2>&1 || \
			{ apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $$package >/dev/null 2>&1; } || \
			echo "could not install $$package: the tests that need $$tool will skip"; \
		else \
			echo "$$tool is missing and apt-get (as root) is not available: its tests will skip"; \
		fi; \
	done

# tests/harness/test_real_clients.py drives the agents' real clients (Claude Code, Codex, the
# MCP Inspector), pinned in tests/clients/package-lock.json. npm ci installs them when
# node and npm are present, again only when the lock changes; without node those
# tests skip and say so.
CLIENTS := tests/clients
CLIENTS_INSTALLED := $(CLIENTS)/node_modules/.installed

clients:
	@if ! command -v npm >/dev/null; then \
		echo "node/npm are missing: the tests with the agents' real clients will skip"; \
	elif [ ! -e $(CLIENTS_INSTALLED) ] || [ $(CLIENTS)/package-lock.json -nt $(CLIENTS_INSTALLED) ]; then \
		echo "installing the agents' real clients with npm ci in $(CLIENTS)"; \
		(cd $(CLIENTS) && npm ci --no-audit --no-fund --loglevel=error >/dev/null) && \
		touch $(CLIENTS_INSTALLED) || \
		echo "npm ci failed: the tests with the agents' real clients will skip"; \
	fi

bench: $(INSTALLED)
	$(BIN)/python scripts/bench.py

# The documentation site from docs/ (mkdocs.yml), served on this host only, rebuilt
# as the pages change; tests/project/test_docs_site.py builds it with --strict.
DOCS_ADDR ?= 127.0.0.1:8000
docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr $(DOCS_ADDR)

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "agentbus needs Python 3.10 or newer"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One environment for both, with every extra (`all`: the views, the MCP server
# and Spark; the demo's history report needs Spark, the tests drive them all)
# and `dev` (pytest, hypothesis, playwright).
$(INSTALLED): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info demo $(CLIENTS)/node_modules
