# lightning_cqk: every target installs what it needs into $(VENV) first.
#   make quickstart    train the quickstart config (tiny model, built-in corpus, CPU or GPU)
#   make test          run the test suite (what CI runs)
#   make ablations     an ablation study of the papers (default: coupling, cpu profile; STUDY=all: every one) and its report
#   make bench         the speed table (framework overhead, backends vs standard, loader, prepare, inference)
#   make glue CKPT=... GLUE fine-tuning table of a checkpoint
#   make eval CKPT=... lm-evaluation-harness tasks on a checkpoint (TASKS=hellaswag,arc_easy,piqa,lambada_openai)
PYTHON ?= python3
VENV ?= .venv
PIP_ARGS ?=
CONFIG ?= configs/quickstart.yaml
STUDY ?= coupling
PROFILE ?= cpu
BIN := $(VENV)/bin
TORCH ?= 2.13.0
export LITDATA_DISABLE_VERSION_CHECK := 1
# Folder of the small real corpora that `{shared_data}` names in the studies' specs (the corpus study's cpu profile);
# the package has no default for it. Override: make ablations STUDY=corpus LIGHTNING_CQK_SHARED_DATA=/path/to/data
LIGHTNING_CQK_SHARED_DATA ?= ../shared/data
export LIGHTNING_CQK_SHARED_DATA

.DEFAULT_GOAL := help
.PHONY: help install quickstart test test-fast test-slow lint format fit print-config tensorboard clean ablations study-data

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

# Every install is the locked environment: requirements.lock pins every package of every extra (made by `make lock`,
# universal over Python >= 3.10 and platforms), given to pip as constraints so that pip installs exactly those versions.
LOCK := requirements.lock
# litdata requires torchvision but uses it only for image and video serializers (this project stores tokens), and
# torchmetrics imports it whenever it is installed: PyPI's torchvision is a CUDA build that fails to load beside a
# CPU build of torch ("operator torchvision::nms does not exist"). The lock leaves it out and the install removes it.
UNINSTALL_TORCHVISION = $(1)python -m pip uninstall --quiet --yes torchvision
EXTRAS := test,dev,eval,data
$(BIN)/.installed: pyproject.toml $(LOCK)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "lightning_cqk needs Python >= 3.10; set PYTHON=python3.x")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c $(LOCK) -e '.[$(EXTRAS)]'
	$(call UNINSTALL_TORCHVISION,$(BIN)/)
	@touch $@

install: $(BIN)/.installed ## create $(VENV) and install the package, its extras (test,dev,eval,data), at the locked versions

.PHONY: lock test-latest
lock: ## regenerate requirements.lock from pyproject.toml (newest releases in range; torch pinned by TORCH=)
	$(PYTHON) -m venv .venv-lock && .venv-lock/bin/python -m pip install --quiet uv
	echo 'torch==$(TORCH)' > .venv-lock/pins.txt
	echo "torchvision ; python_version < '0'" > .venv-lock/drop.txt
	.venv-lock/bin/uv pip compile pyproject.toml --all-extras --universal --python-version 3.10 \
		--constraint .venv-lock/pins.txt --override .venv-lock/drop.txt --no-header --annotation-style line \
		-o $(LOCK).new
	{ echo '# The locked environment of lightning_cqk: `make install` gives this file to pip as constraints.'; \
	  echo '# Regenerate with `make lock [TORCH=x.y.z]` (uv pip compile --universal, Python >= 3.10); the suite was run'; \
	  echo '# with these versions. `make test-latest` runs it against the newest releases instead.'; \
	  cat $(LOCK).new; } > $(LOCK) && rm $(LOCK).new

test-latest: ## run the suite against the newest releases pyproject.toml allows (in .venv-latest; not the lock)
	test -x .venv-latest/bin/python || $(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python -m pip install --quiet --upgrade pip
	.venv-latest/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager $(PIP_ARGS) -e '.[$(EXTRAS)]'
	$(call UNINSTALL_TORCHVISION,.venv-latest/bin/)
	LIGHTNING_CQK_UNLOCKED=1 .venv-latest/bin/python -m pytest -m "not gpu" -q -n $(TEST_JOBS)

quickstart: install ## train configs/quickstart.yaml (tiny model on the built-in corpus; ~70 s on 2 idle CPU cores, more when busy)
	$(BIN)/lightning_cqk fit --config configs/quickstart.yaml

TEST_JOBS ?= 2
test: install ## run every CPU test, the multi-process and SLURM tests included, in TEST_JOBS processes (what CI runs; ~18 min on 2 cores)
	$(BIN)/python -m pytest -m "not gpu" -q -n $(TEST_JOBS) --dist worksteal --durations=25

# The test pyramid (tests/conftest.py marks each test with its layer): tests/unit/ mirrors the package and starts no
# process (tests/unit/conftest.py), tests/contract/ is the backend harness (contract_smoke: one case per backend),
# tests/e2e/ trains tiny runs and starts processes. `make test` runs them all.
test-fast: install ## the fast loop: unit tests + one contract case per backend (under 60 s on 2 idle cores)
	$(BIN)/python -m pytest tests/unit tests/contract -m "(unit or contract_smoke) and not slow and not gpu" -q -n $(TEST_JOBS)

test-slow: install ## only the slow multi-process tests
	$(BIN)/python -m pytest -m "slow and not gpu" -q

lint: install ## ruff check and format check
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install ## ruff format and autofix
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

fit: install ## train any config: make fit CONFIG=configs/quickstart.yaml
	$(BIN)/lightning_cqk fit --config $(CONFIG)

print-config: install ## print the resolved config: make print-config CONFIG=...
	$(BIN)/lightning_cqk fit --config $(CONFIG) --print_config

ALL_STUDIES := $(sort $(basename $(notdir $(wildcard configs/ablations/*.yaml))))
ARGS ?=
ablations: install ## run a study and its report: make ablations [STUDY=coupling|all] [PROFILE=cpu] [ARGS=--dry-run] (its estimate first; asks before an hour from a terminal; resumable)
ifeq ($(STUDY),all)
	@failed=''; for s in $(ALL_STUDIES); do \
		echo "== $$s"; $(BIN)/lightning_cqk sweep configs/ablations/$$s.yaml --profile $(PROFILE) --confirm $(ARGS) || failed="$$failed $$s"; \
	done; if [ -n "$$failed" ]; then echo "studies with failed runs:$$failed (run the same command again to resume)"; exit 1; fi
else
	$(BIN)/lightning_cqk sweep configs/ablations/$(STUDY).yaml --profile $(PROFILE) --confirm $(ARGS)
endif

.PHONY: gpu-stratum
gpu-stratum: install ## on a GPU machine: the pre-registered GPU stratum of the WikiText-2 claim (64 seeds), reported apart
	$(BIN)/lightning_cqk sweep configs/ablations/corpus.yaml --profile gpu $(if $(OUTPUT),--output $(OUTPUT))

.PHONY: bench
BENCH_ARGS ?=
bench: install ## speed table, side by side: Lightning vs plain loop, backends vs standard, loader, prepare, inference (BENCH_ARGS=...)
	$(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

# The GPU check (benchmarks/gpu_check.py): prep where pip reaches the index, run on the GPU machine with .devcheck/
# copied along. The GPU machine's python3 holds a CUDA torch and no package index: no venv, no install target.
.PHONY: gpu-check-prep gpu-check
gpu-check-prep: install ## download the wheels the GPU image lacks (locked versions, Python 3.12) into .devcheck/
	$(BIN)/python benchmarks/gpu_check.py --prep

gpu-check: ## on the GPU machine: env, GPU suite, backend bench at 60m, kernel/memory probes, FSDP2 resume; ~8 min
	python3 benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

DIR ?= ../shared/data
study-data: install ## fetch the corpus studies' text (WikiText-2 test, PubMed, C4) into DIR (../shared/data), checked
	$(BIN)/lightning_cqk study-data $(DIR)

tensorboard: install ## serve the curves of every run under runs/ (Custom Scalars tab: loss, val/ppl, grad norms first)
	@echo "curves of every run under runs/: open http://localhost:6006/#custom_scalars (loss first; Time Series: every tag)"
	$(BIN)/tensorboard --logdir runs

clean: ## remove caches (keeps runs/, data/ and the virtualenv)
	rm -rf .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -not -path './$(VENV)/*' -exec rm -rf {} +

# ---------------------------------------------------------------------------------------------- downstream (GLUE)
CKPT ?=
SEEDS ?= 1 2 3
GLUE_STEPS ?= 60
GLUE_BATCH ?= 16
GLUE_EVAL ?= 1000
GLUE_DIR ?= ../shared/data/glue
GLUE_TASKS ?=
GLUE_ARGS ?=
_comma := ,
_space := $(subst ,, )
_list = [$(subst $(_space),$(_comma) ,$(strip $(1)))]
.PHONY: glue
glue: install ## GLUE table of a checkpoint: make glue CKPT=<ckpt> [SEEDS="1 2 3"] [GLUE_STEPS=60] [GLUE_TASKS="cola rte"]
	@test -n "$(CKPT)" || { echo "usage: make glue CKPT=runs/<experiment>/<run>/checkpoints/last.ckpt"; exit 2; }
	$(BIN)/lightning_cqk glue --checkpoint $(CKPT) --seeds '$(call _list,$(SEEDS))' --max_steps $(GLUE_STEPS) \
		--batch_size $(GLUE_BATCH) --max_eval_examples $(GLUE_EVAL) --data_dir $(GLUE_DIR) \
		$(if $(strip $(GLUE_TASKS)),--tasks '$(call _list,$(GLUE_TASKS))') $(if $(strip $(GLUE_ARGS)),--extra_args '$(GLUE_ARGS)')

# ------------------------------------------------------------------------------------------ lm-evaluation-harness
TASKS ?= hellaswag,arc_easy,piqa,lambada_openai
NUM_FEWSHOT ?=
LIMIT ?=
EVAL_BATCH ?= 16
EVAL_ARGS ?=
.PHONY: eval
eval: install ## lm-eval tasks on a checkpoint: make eval CKPT=<ckpt> [TASKS=hellaswag,arc_easy] [NUM_FEWSHOT=5] [LIMIT=100]
	@test -n "$(CKPT)" || { echo "usage: make eval CKPT=runs/<experiment>/<run>/checkpoints/last.ckpt [TASKS=hellaswag,arc_easy]"; exit 2; }
	$(BIN)/lightning_cqk eval --checkpoint $(CKPT) --tasks $(TASKS) --batch_size $(EVAL_BATCH) \
		$(if $(strip $(NUM_FEWSHOT)),--num_fewshot $(NUM_FEWSHOT)) $(if $(strip $(LIMIT)),--limit $(LIMIT)) $(EVAL_ARGS)
