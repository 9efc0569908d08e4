# zhpipe: `make run` and `make test` create the environment when needed, install, and go.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# the CPU build of PyTorch where no NVIDIA GPU is present (a plain `torch` pulls a multi-GB CUDA build)
TORCH_CPU ?= torch==2.13.0
PIPELINE ?= chnsenticorp
ARGS ?=

.PHONY: run test install bench ui clean-data

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		echo "GPU found: installing the default (CUDA) PyTorch build"; $(BIN)/pip install --quiet torch; \
	else \
		echo "no GPU: installing the CPU build $(TORCH_CPU)"; $(BIN)/pip install --quiet $(TORCH_CPU); \
	fi
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/zhpipe run $(PIPELINE) $(ARGS)

test: install
	$(BIN)/python -m pytest $(ARGS)

bench: install
	$(BIN)/python benchmarks/bench_pipeline.py $(ARGS)

ui: install
	$(BIN)/zhpipe ui
