# The checkout's two commands (README): `make demo` and `make test`. Each first sets up what a
# fresh machine lacks: the OpenSSH server the sandbox box and the integration tests start
# (apt-get, as root or through sudo), Chromium for the report's browser test (`make test`
# only), and .venv with outrig installed editable with its test
# tools. .ci/run is `make test`, so CI and a developer run exactly the same steps.
#
#   make demo                        the main job against a local sandbox box (outrig demo)
#   make demo DEMO_ARGS="--delay 120"  ... behind a 240 ms round trip
#   make test                        ruff, mypy and the whole suite (-n 2), real-tool tiers too
#   make test PYTEST_ARGS=tests/unit   ... the same set-up, then only these tests
#   make test-fast                   the fast loop: the tests that start no server or process
#   make venv                        only the set-up of .venv

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.ONESHELL:

PYTHON ?= python3
VENV := .venv
# Written once .venv holds outrig and its test tools; redone when pyproject.toml changes.
INSTALLED := $(VENV)/.outrig-installed
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test test-fast venv sshd chromium

demo: sshd venv
	$(VENV)/bin/outrig demo $(DEMO_ARGS)

# The real vLLM (CPU build) and the real speculators trainer, for tests/realvllm and the CPU
# rehearsal: .ci/venvs installs them once at a stable place (several minutes the first time)
# and prints their interpreters.
test: sshd chromium venv
	@echo "test: the real tools' venvs"
	eval "$$(.ci/venvs)"
	export OUTRIG_VLLM_PYTHON OUTRIG_REHEARSAL_PYTHON
	echo "test: ruff"
	$(VENV)/bin/ruff check .
	echo "test: mypy"
	$(VENV)/bin/mypy
	echo "test: pytest"
	$(VENV)/bin/python -m pytest -q -n 2 --dist worksteal $(PYTEST_ARGS)

# The fast loop: the tests that start no real server (sshd, vLLM, the trainer) and no real
# process they wait on (the markers tests/conftest.py sets), so neither sshd nor the real
# tools' venvs. Four workers on two cores: what is left mostly waits on subprocesses.
test-fast: venv
	$(VENV)/bin/python -m pytest -q -n 4 -m "not servers and not processes" $(PYTEST_ARGS)

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	@echo "make: .venv with outrig (editable) and its test tools"
	if ! $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
	  echo "make: outrig needs Python 3.10 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1)." \
	       "Run again with PYTHON=python3.X" >&2
	  exit 1
	fi
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $@

# The sandbox box and the integration tests run a real OpenSSH sshd on 127.0.0.1 (and
# ssh-keygen for its throwaway keys); a fresh machine may lack both.
sshd:
	@if command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; then
	  if command -v ssh-keygen >/dev/null 2>&1; then exit 0; fi
	fi
	echo "make: installing openssh-server and openssh-client (sshd or ssh-keygen is missing)"
	if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
	$$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openssh-server openssh-client

# The report's browser test (tests/unit/test_report_browser.py) opens `outrig report`'s page in
# the system's headless Chromium; installed once, skipped when it is already there.
chromium:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then exit 0; fi
	echo "make: installing chromium (the report's browser test)"
	if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
	$$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium
