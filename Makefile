# `make run`: the workflow on the example input; `make test`: the test suite (`make test-fast`:
# its tests that start no program); `make lint`: the format and lint checks CI runs; `make
# wheel`: the wheel in dist/; `make release`: the tag
# vX.Y.Z of esmshard/version.py and its wheel. Each creates .venv with the project and what
# running needs installed (the test and lint tools only for `make test` and `make lint`). TORCH picks the
# torch build (default: the release this project is tested with); ARGS passes extra options to
# snakemake (or pytest), e.g.
#   make run ARGS="--config model=random:esm2_t6_8M_UR50D --resources gpu=4"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
ARGS ?=
# Without setuptools' warning block on each install: the compat mode is chosen (EDITABLE).
PIP = PYTHONWARNINGS="ignore:Compat editable installs" $(BIN)/python -m pip install --quiet
# The clone's own folder on the path, not setuptools' import hook: with the hook, a notebook
# in the folder above a clone named esmshard/ imports that folder as an empty namespace package.
EDITABLE = --config-settings editable_mode=compat -e
# The clone's package byte-compiled once: pip compiles what it installs, but not an editable
# install's folder, and where PYTHONDONTWRITEBYTECODE is set every process (each Snakemake job's
# too) would compile the modules it imports again.
COMPILE = $(BIN)/python -m compileall -q esmshard >/dev/null
# `make wheelhouse`: wheels for a GPU node without network (PY: its Python; HAVE: its pip freeze).
PY ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEELHOUSE ?= wheelhouse
HAVE ?=
# `make gpu-check`: GPU_PYTHON is a Python with CUDA torch and the wheelhouse installed (default:
# .venv's, with the gpu-check extra); the results go to GPU_CHECK_OUT; ARGS="--stages ..." runs
# some of its stages alone.
GPU_PYTHON ?= $(BIN)/python
GPU_CHECK_OUT ?= gpu-check
BIN = $(VENV)/bin
# 291 real E. coli K-12 proteins: every 15th record of the reference proteome, taken from
# ../shared/data beside the checkout or downloaded once from UniProt into resources/.
EXAMPLE = resources/ecoli_k12_example.fasta

VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' esmshard/version.py)
DEFAULT_MODEL = esm2_t33_650M_UR50D

.PHONY: run test test-fast lint clean wheel release wheelhouse gpu-check

$(BIN)/snakemake: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) "$(TORCH)"
	$(PIP) $(EDITABLE) ".[cluster]"
	$(COMPILE)
	touch $@

# The test and lint tools, beside what running needs (the test extra holds gpu-check's).
$(VENV)/.test-tools: $(BIN)/snakemake
	$(PIP) $(EDITABLE) ".[test,cluster]"
	touch $@ $(VENV)/.gpu-check-tools

# What gpu-check imports beside a run's needs (pytest, transformers).
$(VENV)/.gpu-check-tools: $(BIN)/snakemake
	$(PIP) $(EDITABLE) ".[gpu-check,cluster]"
	touch $@

$(VENV)/.lint-tools: $(BIN)/snakemake
	$(PIP) $(EDITABLE) ".[lint,cluster]"
	touch $@

$(EXAMPLE): | $(BIN)/snakemake
	$(BIN)/python -m esmshard.input.datasets example $@

# The example only where ARGS names no input of its own: a machine without network runs
# `make run ARGS="--config model=random:esm2_t6_8M_UR50D input=proteins.fasta"`.
run: $(BIN)/snakemake $(if $(findstring input=,$(ARGS)),,$(EXAMPLE))
	@case "$(ARGS)" in *model=*) ;; *) echo "esmshard: the default model, $(DEFAULT_MODEL), downloads its weights (2.6 GB) once into torch's hub cache; to run without the download: make run ARGS=\"--config model=random:esm2_t6_8M_UR50D\"";; esac
	PATH="$(abspath $(BIN)):$$PATH" snakemake --cores all $(ARGS)

# The tests read the real data in ../shared/data, or fetch it once into resources/test-data.
# TEST_WORKERS pytest processes share the test files, each file whole on one worker: its
# module-scoped runs are made once, and tests that must not overlap (the SLURM cluster's, one
# machine-wide set of daemons) run one after another; the longest files first (by the record
# tests/file_costs.json, which benchmarks/suite_cost.py --record writes; kept in that order by
# --no-loadscope-reorder). The run
# ends with its 25 slowest tests and its total time. OMP_WAIT_POLICY=PASSIVE: torch's CPU
# threads sleep rather than spin while they wait, so that the workers' and their jobs' threads
# do not take the cores from each other (15% off the parity tests' time on 2 cores,
# docs/benchmarks.md). Three workers on 2 cores:
# the suite waits on its subprocesses often enough that a third takes 7% off (1,107 s against
# 1,187 s), each test taking longer.
TEST_WORKERS ?= 3
test: $(VENV)/.test-tools
	OMP_WAIT_POLICY=PASSIVE PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(ARGS)

# `make test-fast`: the inner loop, the tests that start no program (tests/conftest.py marks the
# others e2e: the workflow through `snakemake`, the console script, pip, SLURM), in minutes.
test-fast: $(VENV)/.test-tools
	OMP_WAIT_POLICY=PASSIVE PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not e2e" --durations=10 $(ARGS)

lint: $(VENV)/.lint-tools
	$(BIN)/snakefmt --check Snakefile workflow
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	PATH="$(abspath $(BIN)):$$PATH" snakemake --lint

wheelhouse: $(BIN)/snakemake
	$(BIN)/python -m esmshard.commands.wheelhouse --python $(PY) --out $(WHEELHOUSE) $(if $(HAVE),--have $(HAVE))

gpu-check: $(if $(filter $(BIN)/python,$(GPU_PYTHON)),$(VENV)/.gpu-check-tools)
	PATH="$(abspath $(BIN)):$$PATH" $(GPU_PYTHON) -m esmshard.commands.gpucheck --out $(GPU_CHECK_OUT) $(ARGS)

# The wheel that `pip install` takes on any machine (the workflow's files inside it).
wheel: $(BIN)/snakemake
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir dist .
	@echo "esmshard: wrote dist/esmshard-$(VERSION)-py3-none-any.whl"

# A release: the tag that deployments name (snakedeploy --tag vX.Y.Z), on a clean tree.
release: wheel
	@test -z "$$(git status --porcelain)" || { echo "esmshard: commit or stash your changes first"; exit 1; }
	git tag -a "v$(VERSION)" -m "esmshard $(VERSION)"
	@echo "esmshard: tagged v$(VERSION); push it with: git push origin v$(VERSION)"

# The workflow's outputs, Snakemake's records and the README's Python example's store (only
# where store/ is an esmshard store: it holds esmshard's mark).
clean:
	rm -rf results .snakemake
	if [ -f store/.esmshard-store.json ]; then rm -rf store; fi
