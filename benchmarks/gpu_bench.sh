#!/usr/bin/env bash
# GPU benchmark of the portable engine's GPU mode (static KV cache + CUDA graphs) on ONE GPU, in at most
# 5 minutes, using only what the GPU machine has (Python 3.12, torch 2.11, transformers 5.17, numpy 2).
# Writes its table to $OUT/gpu_bench.md (and JSON next to it). Usage on the device machine:
#   bash benchmarks/gpu_bench.sh
# pydantic is not on that image: carry its wheels in .whl/ (git-ignored), prepared here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection pyyaml
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
if ! python3 -c "import pydantic" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  else
    echo "pydantic is missing on this machine: carry its wheels in .whl/ (see this script's header)" >&2
    exit 2
  fi
fi
# The library lives in orchestrator/ and imports as lookahead_reasoning: expose it without installing.
PKG=$(mktemp -d)
ln -s "$PWD/orchestrator" "$PKG/lookahead_reasoning"
export PYTHONPATH="$PKG:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 290 python3 -u benchmarks/gpu_bench.py --out "$OUT/gpu_bench.md" --json "$OUT/gpu_bench.json"
