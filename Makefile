# The two commands of the README: `make run` (the local stack) and `make test` (everything CI checks); `make`
# alone lists the others. They set themselves up on a fresh machine: a Python 3.12 virtualenv in .venv with the
# project installed. A target's line in `make help` is the `## ...` comment after its name.

SHELL := /bin/bash
# A recipe step fails when any command of a pipeline does (the install step filters pip's output).
.SHELLFLAGS := -eo pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
# The first Python 3.12 that actually runs: python3.12 on PATH (a pyenv shim may not), else pyenv's newest 3.12.
PYTHON312 ?= $(shell for p in $$(command -v python3.12) $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12.*/bin/python3.12 2>/dev/null | sort -rV); do "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
# sam build looks for python3.12 on PATH: the virtualenv's own interpreter is one.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Some machines export PYTHONDONTWRITEBYTECODE; every process would then compile its imports from source
# again (the tests' subprocesses and workers, the local stack). __pycache__ is git-ignored.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help run stop test lint venv browser sam-check deploy bench lock clean
.DEFAULT_GOAL := help

help: ## this list
	@awk -F':.*## ' '/^[a-z-]+:.*## / { printf "  make %-10s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# Exact versions everywhere: requirements-dev.lock is what the virtualenv (tests, `make run`, the tools) gets;
# layers/eros/requirements.lock and layers/auth/requirements.lock are what the Lambda layers ship -- the same
# versions, for Lambda's platform, with hashes. `make lock` writes them again after a change to what
# pyproject.toml, requirements-dev.txt or a layer's requirements.txt ask for; tests/test_packaging.py checks that
# they agree and match the virtualenv.
$(VENV)/.installed: pyproject.toml requirements-dev.lock layers/eros/requirements.txt layers/auth/requirements.txt \
		requirements-dev.txt clients/python/pyproject.toml
	@test -n "$(PYTHON312)" || { echo "Python 3.12 is required (python3.12 on PATH, or pyenv install 3.12)"; exit 1; }
	@echo "setting up $(VENV) with $(PYTHON312) (the first time: about a minute and a half)"
	@$(PYTHON312) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo "installing the locked packages (requirements-dev.lock)"
	@$(PY) -m pip install --progress-bar off -r requirements-dev.lock 2>&1 \
		| awk '/^Collecting/ { if (++n % 25 == 0) { print "  " n " packages fetched"; fflush() } } \
		       /^(ERROR|error)/ { print } /^Successfully installed/ { print "  " n " packages installed" }'
	@$(PY) -m pip install --quiet --no-deps -e .
	@$(PY) -m pip install --quiet --no-deps -e clients/python
	@touch $@

venv: $(VENV)/.installed ## the Python 3.12 virtualenv (.venv) with the locked packages and the project

# Ctrl-C stops the stack and the embedded Postgres it started; `make stop` does the same from elsewhere.
run: venv ## the local stack: API, dreaming, console, embedded Postgres (Ctrl-C stops it)
	@$(VENV)/bin/eros serve

stop: ## stop a local stack started elsewhere
	@if [ -x $(VENV)/bin/eros ]; then $(VENV)/bin/eros stop; else echo "nothing was running"; fi

test: venv browser ## everything CI checks: lint, every test, sam-check
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -n 2
	$(MAKE) --no-print-directory sam-check

# The linter (pyflakes, pycodestyle, bugbear, complexity <= 10, import order) and the type checker over the
# package, the functions, the tests and the benches; configuration in pyproject.toml. Part of `make test`.
lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The console's browser tests drive the OS's browsers: Chromium through Playwright (tests/test_console_browser.py)
# and Firefox over WebDriver BiDi through puppeteer-core (tests/test_console_firefox.py, tests/browser). Browsers
# that the drivers download would not run here (nothing outside the package registries is reachable), so the
# packages come from apt, and the driver from npm at the versions of tests/browser/package-lock.json.
BROWSER_PACKAGES := $(if $(shell command -v chromium),,chromium) $(if $(shell command -v firefox-esr),,firefox-esr) \
	$(if $(shell command -v npm),,nodejs npm)
browser: tests/browser/node_modules/.installed ## the browsers and driver of the console's browser tests

tests/browser/node_modules/.installed: tests/browser/package-lock.json
	@if [ -n "$(strip $(BROWSER_PACKAGES))" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(strip $(BROWSER_PACKAGES)) for the browser tests (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null; \
	  else echo "the browser tests need: sudo apt-get install -y $(strip $(BROWSER_PACKAGES))"; exit 1; fi; fi
	@npm ci --prefix tests/browser --ignore-scripts --no-audit --no-fund --loglevel=error
	@touch $@

# The Lambda architecture the layer is built for and the stack deploys (the template's Architecture). sam build
# does not tell the layer's makefile build which one (layers/eros/Makefile reads LAMBDA_ARCH), nor does its
# cache tell them apart: one cache per architecture.
ARCH ?= arm64
export LAMBDA_ARCH := $(ARCH)

sam-check: venv ## cfn-lint, sam validate --lint and sam build (ARCH=arm64|x86_64) of template.yaml
	$(VENV)/bin/cfn-lint template.yaml
	$(VENV)/bin/sam validate --lint
	$(VENV)/bin/sam build --cached --cache-dir .aws-sam/cache-$(ARCH) --build-dir .aws-sam/build \
		--parameter-overrides Architecture=$(ARCH)

# `make deploy`: the checks, then `sam deploy` with samconfig.toml (stack "eros", the change set shown for a
# yes) and the few answers below (docs/DEPLOY.md, "First deploy"). A new stack gets PROFILE=starter unless
# told otherwise; an existing one keeps its profile (and every parameter not given) unless PROFILE is set.
# PARAMS adds any other Name=value (e.g. PARAMS="CorsAllowOrigins=https://console.example.com").
STACK ?= eros
PROFILE ?=
ALARM_EMAIL ?=
PASSWORD_AUTH ?=
PARAMS ?=
deploy: venv ## check, build and deploy to AWS (PROFILE=starter|production ALARM_EMAIL= PASSWORD_AUTH=true ARCH=)
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -p no:cacheprovider tests/test_template.py tests/test_packaging.py tests/test_deploy_config.py
	$(MAKE) --no-print-directory sam-check
	@overrides="Architecture=$(ARCH) $(if $(PROFILE),Profile=$(PROFILE)) $(if $(ALARM_EMAIL),AlarmEmail=$(ALARM_EMAIL)) \
	  $(if $(PASSWORD_AUTH),AllowPasswordAuth=$(PASSWORD_AUTH)) $(PARAMS)"; \
	if [ -z "$(PROFILE)" ] && ! $(VENV)/bin/sam list stack-outputs --stack-name "$(STACK)" >/dev/null 2>&1; then \
	  echo "a new stack: Profile=starter (make deploy PROFILE=production for RDS Proxy and a NAT gateway)"; \
	  overrides="Profile=starter $$overrides"; fi; \
	echo "sam deploy --stack-name $(STACK) --parameter-overrides $$overrides"; \
	$(VENV)/bin/sam deploy --stack-name "$(STACK)" --parameter-overrides $$overrides

bench: venv ## the turn-overhead bench
	$(PY) bench/turn_overhead.py

# The packages the Lambda Python runtime provides, left out of the layer (template.yaml, ErosLayer, says why).
RUNTIME_PROVIDED := boto3 botocore s3transfer urllib3 python-dateutil six
UV_VERSION := 0.13.9

# Both architectures' wheels: uv writes the hashes of every file of each pinned version, so one lock serves a
# layer built for arm64 and for x86_64 (tests/test_layer_build.py builds each for both and checks the wheels).
# Two layers: ErosLayer (every function) and AuthLayer (the stream function's token check alone), each locked from
# its own requirements.txt with the versions of requirements-dev.lock.
LAYER_LOCK = $(VENV)/bin/uv pip compile --quiet --no-cache --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
	--generate-hashes $(addprefix --no-emit-package ,$(RUNTIME_PROVIDED)) --constraint requirements-dev.lock
lock: venv ## write requirements-dev.lock and the layers' requirements.lock again
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(VENV)/bin/uv pip compile --quiet --no-cache --python-version 3.12 --extra dev \
		--output-file requirements-dev.lock pyproject.toml
	$(LAYER_LOCK) --output-file layers/eros/requirements.lock layers/eros/requirements.txt
	$(LAYER_LOCK) --output-file layers/auth/requirements.lock layers/auth/requirements.txt

clean: stop ## remove .venv, the SAM build and the local data
	rm -rf $(VENV) .aws-sam .data .artifacts
