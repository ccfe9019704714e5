# `make run`: the workflow on the example input; `make test`: the test suite; `make lint`: the
# format and lint checks CI runs. Each creates .venv with the project installed. TORCH picks the
# torch build (default: the release this project is tested with); ARGS passes extra options to
# snakemake (or pytest), e.g.
#   make run ARGS="--config model=random:esm2_t6_8M_UR50D --resources gpu=4"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
ARGS ?=
# `make wheelhouse`: wheels for a GPU node without network (PY: its Python; HAVE: its pip freeze).
PY ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEELHOUSE ?= wheelhouse
HAVE ?=
# `make gpu-check`: GPU_PYTHON is a Python with CUDA torch and the wheelhouse installed (default:
# .venv's); the results go to GPU_CHECK_OUT.
GPU_PYTHON ?= $(BIN)/python
GPU_CHECK_OUT ?= gpu-check
BIN = $(VENV)/bin
# 291 real E. coli K-12 proteins: every 15th record of the reference proteome, taken from
# ../shared/data beside the checkout or downloaded once from UniProt into resources/.
EXAMPLE = resources/ecoli_k12_example.fasta

.PHONY: run test lint clean wheelhouse gpu-check

$(BIN)/snakemake: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test,cluster,lint]"
	touch $@

$(EXAMPLE): | $(BIN)/snakemake
	$(BIN)/python -m esmshard.input.datasets example $@

run: $(BIN)/snakemake $(EXAMPLE)
	PATH="$(abspath $(BIN)):$$PATH" snakemake --cores all $(ARGS)

# The tests read the real data in ../shared/data, or fetch it once into resources/test-data.
# TEST_WORKERS pytest processes share the test files, each file whole on one worker: its
# module-scoped runs are made once, and tests that must not overlap (the SLURM cluster's, one
# machine-wide set of daemons) run one after another. The run ends with its 25 slowest tests
# and its total time.
TEST_WORKERS ?= 2
test: $(BIN)/snakemake
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 $(ARGS)

lint: $(BIN)/snakemake
	$(BIN)/snakefmt --check Snakefile workflow
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	PATH="$(abspath $(BIN)):$$PATH" snakemake --lint

wheelhouse: $(BIN)/snakemake
	$(BIN)/python -m esmshard.commands.wheelhouse --python $(PY) --out $(WHEELHOUSE) $(if $(HAVE),--have $(HAVE))

gpu-check: $(if $(filter $(BIN)/python,$(GPU_PYTHON)),$(BIN)/snakemake)
	PATH="$(abspath $(BIN)):$$PATH" $(GPU_PYTHON) -m esmshard.commands.gpucheck --out $(GPU_CHECK_OUT)

clean:
	rm -rf results .snakemake
