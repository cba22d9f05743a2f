#!/usr/bin/env bash
# Container entry point.
#   triton PROFILE.yaml     render the Triton model repository for the profile and run tritonserver
#                           (HTTP 8000, gRPC 8001, metrics 8002)
#   serve-role SPEC.yaml    serve ONE role with trtllm-serve (OpenAI-compatible, the spec's port); builds the
#                           spec first (FP8 quantization etc.) if its build folder is missing
#   build SPEC.yaml [...]   lookahead-reasoning build for each spec (extra args after `--`)
#   anything else           exec'd as is (e.g. bash)
set -euo pipefail
cmd="${1:-triton}"; shift || true

build_spec() {  # SPEC [build args...]
  python /app/build_scripts/build_engine.py --spec "$@"
}

case "$cmd" in
  triton)
    profile="${1:-/app/engines/profiles/qwen3-trtllm.yaml}"
    repo="${MODEL_REPOSITORY:-/opt/triton_models}"
    python - "$profile" "$repo" <<'PY'
import sys
from pathlib import Path
from lookahead_reasoning.profiles import load_profile
from lookahead_reasoning.serving.model_repository import render_repository
profile = load_profile(config=sys.argv[1])  # validate before starting the server
roles = tuple(r for r in ("draft", "target", "judge") if getattr(profile, r) is not None)
render_repository(sys.argv[2], profile_config=sys.argv[1], roles=roles, source=Path("/app/triton_models"))
print(f"model repository for profile {profile.name} in {sys.argv[2]}")
PY
    exec tritonserver --model-repository="$repo" --http-port=8000 --grpc-port=8001 --metrics-port=8002 \
      ${TRITON_ARGS:-}
    ;;
  serve-role)
    spec="$1"
    read -r build model port < <(python - "$spec" <<'PY'
import sys
from lookahead_reasoning.production.engine_build import resolve_checkpoint
from lookahead_reasoning.production.engine_specs import load_spec
s = load_spec(sys.argv[1])
print(s.build_dir(), resolve_checkpoint(s.served_checkpoint()), s.port)
PY
)
    if [ ! -f "$build/llm_api_options.yaml" ]; then
      echo "no build in $build: building $spec first" >&2
      build_spec "$spec"
    fi
    # Inside a container the GPUs given to it (compose device_ids) are its devices 0..n-1: no pinning here.
    exec trtllm-serve "${MODEL_PATH:-$model}" --host 0.0.0.0 --port "$port" --backend pytorch \
      --config "$build/llm_api_options.yaml" ${TRTLLM_SERVE_ARGS:-}
    ;;
  build)
    for spec in "$@"; do build_spec "$spec"; done
    ;;
  *)
    exec "$cmd" "$@"
    ;;
esac
