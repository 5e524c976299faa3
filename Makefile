# `make extract` and `make test` set up everything they need (a virtual environment at .venv
# with the pinned dependencies of requirements.lock), then run. CI calls `make test`.
PY ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: setup extract test test-gpu bench clean

$(STAMP): requirements.lock
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install --disable-pip-version-check -q -r requirements.lock
	touch $(STAMP)

setup: $(STAMP)

# A real extraction of the embedded default (tiny Llama, DeepSeek tokenizer, 100 ShareGPT
# conversations, SGLang on the CPU). Pass Hydra overrides with ARGS='model=tiny_qwen3 ...'.
extract: setup
	$(PYTHON) extract.py $(ARGS)

test: setup
	$(PYTHON) -m pytest -q -ra tests $(ARGS)

bench: setup
	$(PYTHON) bench/bench.py $(ARGS)

clean:
	rm -rf outputs multirun .pytest_cache
