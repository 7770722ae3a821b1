# trainledger — set-up and checks. Works on a fresh machine with Python >= 3.11 and pip.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install lint bench clean

# The core install (estimator, planner, CLI) needs no torch.
$(VENV)/.core: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	@touch $@

# Tests need the dev extras: CPU torch==2.13.0, transformers, peft, tokenizers, web, browser driver.
$(VENV)/.dev: $(VENV)/.core
	# torch is pinned here, not in the extras: the CPU build, before anything can ask for a CUDA one
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	# DeepSpeed only to validate exported configs with its own parser; no ops are built, and
	# --no-build-isolation makes it build against the CPU torch already installed (never a CUDA one).
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-build-isolation deepspeed==0.19.8
	@touch $@

install: $(VENV)/.dev

## the main job on built-in defaults: plan the example job
demo: $(VENV)/.core
	$(BIN)/trainledger plan

## the full test suite (what CI runs)
test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: install
	$(BIN)/ruff check src tests bench

bench: install
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info
