# The two commands of the README: `make run` (the local stack) and `make test` (everything CI checks).
# Both set themselves up on a fresh machine: a Python 3.12 virtualenv in .venv with the project installed.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The first Python 3.12 that actually runs: python3.12 on PATH (a pyenv shim may not), else pyenv's newest 3.12.
PYTHON312 ?= $(shell for p in $$(command -v python3.12) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python3.12 2>/dev/null | sort -rV); do "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
# sam build looks for python3.12 on PATH: the virtualenv's own interpreter is one.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Some machines export PYTHONDONTWRITEBYTECODE; every process would then compile its imports from source
# again (the tests' subprocesses and workers, the local stack). __pycache__ is git-ignored.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test lint venv sam-check bench clean

$(VENV)/.installed: pyproject.toml layers/eros/requirements.txt requirements-dev.txt
	@test -n "$(PYTHON312)" || { echo "Python 3.12 is required (python3.12 on PATH, or pyenv install 3.12)"; exit 1; }
	$(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

run: venv
	$(VENV)/bin/eros serve

test: venv
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -n 2
	$(MAKE) --no-print-directory sam-check

# The linter (pyflakes, pycodestyle, bugbear, complexity <= 10, import order) and the type checker over the
# package, the functions, the tests and the benches; configuration in pyproject.toml. Part of `make test`.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

sam-check: venv
	$(VENV)/bin/sam validate --lint
	$(VENV)/bin/sam build --cached --build-dir .aws-sam/build

bench: venv
	$(PY) bench/turn_overhead.py

clean:
	rm -rf $(VENV) .aws-sam .data
