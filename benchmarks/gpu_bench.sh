#!/usr/bin/env bash
# GPU benchmarks on ONE GPU, in about 8 minutes, using only what the GPU machine has (Python 3.12, torch 2.11,
# transformers 5.17, numpy 2):
#   1. the demo trio in GPU mode (engines/profiles/demo-gpu.yaml: static KV cache + CUDA graphs): ar, sd and
#      lr+sd (draft-model and n-gram SD) interleaved per problem after a warm-up (benchmarks/lr_bench.py);
#   2. the engine's GPU mode on random-weight Qwen3-1.7B / Qwen3-32B shapes against transformers
#      (benchmarks/gpu_bench.py).
# Writes its tables and JSON to $OUT (default benchmarks/out). Usage on the device machine:
#   bash benchmarks/gpu_bench.sh          (PROBLEMS=N sets the demo's problem count, default 20;
#                                          PARTS="engine" runs part 2 only, PARTS="demo" part 1 only)
# pydantic is not on that image: carry its wheels in .whl/ (git-ignored), prepared here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl pydantic pydantic-core annotated-types typing-inspection \
#     typing-extensions
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
if ! python3 -c "import pydantic" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 2
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
rc=0
PARTS=${PARTS:-demo engine}
if [[ " $PARTS " == *" demo "* ]]; then
timeout 220 python3 -u benchmarks/lr_bench.py --config engines/profiles/demo-gpu.yaml --problems "${PROBLEMS:-20}" \
  --sweep '' --verifiers '' --sd-draft-tokens 0 --medusa-tokens 0 --eagle-tokens 0 \
  --skip "lr sync [llm],lr async [llm],lr+sd async [llm],lr+sd sync [llm] adaptive gamma" \
  --out "$OUT/lr_bench_gpu.json" >"$OUT/lr_bench_gpu.md" 2>"$OUT/lr_bench_gpu.log" || rc=$?
echo "demo trio (lr_bench, exit $rc):"; cat "$OUT/lr_bench_gpu.md"; tail -c 3000 "$OUT/lr_bench_gpu.log" | tr '\r' '\n' | tail -20
fi
if [[ " $PARTS " == *" engine "* ]]; then
timeout 230 python3 -u benchmarks/gpu_bench.py --budget-s 170 --out "$OUT/gpu_bench.md" --json "$OUT/gpu_bench.json" || rc=$?
fi
exit $rc
