# `make run`: the workflow on the shipped example; `make test`: the test suite.
# Both create .venv with the project installed. TORCH picks the torch build (default: the
# release this project is tested with); ARGS passes extra options to snakemake, e.g.
#   make run ARGS="--config model=random:esm2_t6_8M_UR50D --resources gpu=4"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
ARGS ?=
BIN = $(VENV)/bin

.PHONY: run test lint clean

$(BIN)/snakemake: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test,cluster]"
	touch $@

run: $(BIN)/snakemake
	PATH="$(abspath $(BIN)):$$PATH" snakemake --cores all $(ARGS)

test: $(BIN)/snakemake
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -v $(ARGS)

lint: $(BIN)/snakemake
	PATH="$(abspath $(BIN)):$$PATH" snakemake --lint

clean:
	rm -rf results .snakemake
