#!/usr/bin/env bash
# The serving comparison: `bench` (closed loop, concurrency 1 and 4) against llama-server serving the demo target
# with its speculative decoding (draft-simple with the demo draft, 8 tokens: the peer's best mode in
# benchmarks/llamacpp_peer.py), then against our `serve --profile demo-llamacpp`, same prompts (held-out synthetic
# problems), same token budget, one after the other on the same machine. Every server binds 127.0.0.1 and is stopped.
#
#   benchmarks/serve_peer.sh [REQUESTS] [OUT_DIR]        # default 16 requests per point, benchmarks/out/serve_peer
#
# Needs llama-server (benchmarks/build_llamacpp_tools.sh) and the demo trio as GGUF (make install).
# llama-server gets 1 thread for its target and 1 for its draft (ours: 1 each for target, draft and judge, which run
# one at a time; llama.cpp is slower with more threads than these 2 vCPUs), greedy sampling as its default
# (--temp 0 --top-k 1: bench sends no sampling fields), 4 slots, flash attention off (as our engine); its prompts go
# through its own chat template and tokenizer (the GGUF's), so its prompt ids can differ slightly from ours.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-16}"
OUT="${2:-benchmarks/out/serve_peer}"
PY=.venv/bin/python
BIN="$(bash benchmarks/build_llamacpp_tools.sh)"
mkdir -p "$OUT"
port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 300); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }

P=$(port)
"$BIN/llama-server" -m engines/demo/gguf/target-f32.gguf -md engines/demo/gguf/draft-f32.gguf \
  --spec-type draft-simple --spec-draft-n-max 8 -td 1 -t 1 -tb 1 -c 16384 -np 4 -fa off --temp 0 --top-k 1 \
  --no-webui --host 127.0.0.1 --port "$P" > "$OUT/llama-server.log" 2>&1 &
LS=$!
LR=""
stop() { [ -n "$1" ] && kill "$1" 2>/dev/null; [ -n "$1" ] && wait "$1" 2>/dev/null; return 0; }
trap 'stop "$LS"; stop "$LR"' EXIT
wait_http "http://127.0.0.1:$P/health"
.venv/bin/lookahead-reasoning bench --url "127.0.0.1:$P" --endpoint openai-chat --concurrency 1,4 --requests "$N" \
  --max-tokens 800 --no-progress --out "$OUT/llama_server.json"
stop "$LS"; LS=""

G=$(port); H=$(port); M=$(port)
.venv/bin/lookahead-reasoning serve --profile demo-llamacpp --http-port "$H" --grpc-port "$G" --metrics-port "$M" \
  > "$OUT/serve.log" 2>&1 &
LR=$!
wait_http "http://127.0.0.1:$H/v2/health/ready"
.venv/bin/lookahead-reasoning bench --url "127.0.0.1:$G" --concurrency 1,4 --requests "$N" --modes ar,lr,lr+sd \
  --max-tokens 800 --no-progress --out "$OUT/ours.json"
stop "$LR"; LR=""
echo "summaries: $OUT/llama_server.md $OUT/ours.md"
