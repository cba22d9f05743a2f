#!/usr/bin/env bash
# The peer benchmarks' own step: build llama.cpp's C++ tools (llama-server, llama-speculative-simple, llama-cli)
# from the llama.cpp that llama-cpp-python vendors, the very version our llamacpp runtime runs.
#
#   benchmarks/build_llamacpp_tools.sh [OUT_DIR]      # default benchmarks/out/llamacpp (git-ignored)
#
# Needs cmake, ninja and a C++ compiler (Debian: cmake ninja-build g++); about 5 minutes on 2 cores. The sdist comes
# from PyPI (pip download) at the version installed in .venv. Built with the same no-AMX flags as the Makefile's
# install (native AMX kernels crash on VMs that do not grant AMX tile state), without libcurl (no model download).
# Prints the bin folder on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/out/llamacpp}"
PY="${PYTHON:-.venv/bin/python}"
VER="$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)')"
SRC="$OUT/llama_cpp_python-$VER"
BIN="$OUT/build-$VER/bin"
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-speculative-simple" ]; then
  echo "$BIN"; exit 0
fi
mkdir -p "$OUT"
if [ ! -d "$SRC/vendor/llama.cpp" ]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$OUT/sdist" >&2
  tar -xzf "$OUT/sdist/llama_cpp_python-$VER.tar.gz" -C "$OUT"
fi
NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$SRC/vendor/llama.cpp" -B "$OUT/build-$VER" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" >&2
cmake --build "$OUT/build-$VER" --target llama-server llama-speculative-simple llama-cli -j "$(nproc)" >&2
echo "$BIN"
