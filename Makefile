# headlab developer tasks. From a clean clone: `make test` or `make report`.
# pip + venv only. torch is installed first and pinned to the exact request this
# machine's offline CPU wheel answers; any other torch request pulls GBs of CUDA.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.headlab-installed
TORCH  := torch==2.13.0
# The GPU machine's python3 version: gpu-kit fetches the test runner's wheels for it (hypothesis is compiled).
GPU_PYTHON ?= 3.12

.DEFAULT_GOAL := help
.PHONY: help install report report-full lint test test-all bench gpu-kit readme docs clean distclean

help:
	@echo "make report    build the HTML report into report/index.html (reduced budgets: a few minutes)"
	@echo "make report-full  the same with full experiment and analysis budgets (much longer)"
	@echo "make lint      ruff over src and tests, then mypy over the package (make test runs it first)"
	@echo "make test      lint, then the test suite (without tests marked slow)"
	@echo "make test-all  lint, then every test, slow ones included"
	@echo "make bench     run the benchmark suite and regenerate benchmarks/RESULTS.md and docs/scaling.md's numbers"
	@echo "make gpu-kit   write .gpu/: the default model in bfloat16 and pytest, for headlab bench and the CUDA tests on a GPU machine (docs/benchmarks.md)"
	@echo "make readme    regenerate the README sentences written by the analysis"
	@echo "make docs      regenerate the architecture tables of docs/models.md from the tests"
	@echo "make clean     remove build, test and report outputs (keeps .venv)"
	@echo "make distclean clean, and remove .venv"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install $(TORCH)
	$(BIN)/pip install -e ".[all]"
	# The browser tests drive Debian's chromium; browsers cannot be downloaded here.
	test -x /usr/bin/chromium || (sudo apt-get update && sudo apt-get install -y chromium) \
		|| (apt-get update && apt-get install -y chromium)
	touch $@

install: $(STAMP)

report: $(STAMP)
	$(BIN)/headlab report --quick

report-full: $(STAMP)
	$(BIN)/headlab report

# Settings in pyproject.toml ([tool.ruff], [tool.mypy]); both tools come with the test extra.
lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

test-all: lint
	$(BIN)/python -m pytest -m ""

bench: $(STAMP)
	$(BIN)/headlab bench --out benchmarks/RESULTS.md
	$(BIN)/python -m tests.support.regenerate scaling  # docs/scaling.md's numbers, from RESULTS.json

gpu-kit: $(STAMP)
	$(BIN)/python -m headlab.bench.kit .gpu
	# pytest and hypothesis for the GPU machine's python3, without their optional extras (the kit must stay small)
	$(BIN)/pip install --quiet --upgrade --no-deps --target .gpu/py --python-version $(GPU_PYTHON) \
		--only-binary=:all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
		pytest pluggy iniconfig packaging hypothesis sortedcontainers

readme: $(STAMP)
	$(BIN)/python -m tests.support.regenerate readme

docs: $(STAMP)
	$(BIN)/python -m tests.support.regenerate models

clean:
	rm -rf report/ test-artifacts/ build/ dist/ .pytest_cache/ .hypothesis/ .gpu/ .mypy_cache/ .ruff_cache/
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -print \
		| xargs rm -rf

distclean: clean
	rm -rf $(VENV)
