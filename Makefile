# zhpipe: `make run` and `make test` create the environment when needed, install, and go.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# the CPU build of PyTorch where no NVIDIA GPU is present (a plain `torch` pulls a multi-GB CUDA build)
TORCH_CPU ?= torch==2.13.0
PIPELINE ?= chnsenticorp
ARGS ?=

.PHONY: run test test-quick lint format install fonts bench ui

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

install: $(VENV)/.installed fonts

# the profile stage draws Chinese text: it needs a font with CJK glyphs (WenQuanYi Micro Hei, 5 MB, where none is found)
fonts:
	@if command -v fc-list >/dev/null 2>&1 && ! fc-list :lang=zh | grep -q . ; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "no CJK font: installing fonts-wqy-microhei"; \
			apt-get install -y -q fonts-wqy-microhei >/dev/null 2>&1 || \
			{ apt-get update -q >/dev/null 2>&1 && apt-get install -y -q fonts-wqy-microhei >/dev/null 2>&1; } || \
			echo "could not install a CJK font; the profile stage will stop with a message (see README)"; \
		else \
			echo "no CJK font found: the profile stage needs one, e.g. sudo apt-get install fonts-wqy-microhei"; \
		fi; \
	fi

run: install
	$(BIN)/zhpipe run $(PIPELINE) $(ARGS)

# test modules run in TEST_WORKERS processes (whole modules each, so module fixtures are built once; the team's
# modules as one unit, first: tests/helpers/schedule.py);
# much of the suite waits on real servers and subprocesses, so 2 workers help even on 2 cores
TEST_WORKERS ?= 2

# the 15 slowest tests are printed at the end of every run, so where the time goes stays in view
test: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15 $(ARGS)

# the formatter's check and the linter's rules over the whole tree (pyproject.toml [tool.ruff]); CI runs it
# before the tests. `make format` rewrites what the formatter would change.
LINTED = flows tasks tests benchmarks docs/screenshots.py
lint: install
	$(BIN)/ruff format --check --no-cache $(LINTED)
	$(BIN)/ruff check --no-cache $(LINTED)

format: install
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

# the edit loop: every test but the end-to-end flow runs (marker e2e); `make test` stays the full suite CI runs
test-quick: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=10 -m "not e2e" $(ARGS)

bench: install
	$(BIN)/python benchmarks/bench_pipeline.py $(ARGS)

ui: install
	$(BIN)/zhpipe ui
