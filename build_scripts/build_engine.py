#!/usr/bin/env python
"""Build served artifacts from an engine spec: the same as ``lookahead-reasoning build``.

    python build_scripts/build_engine.py --spec engines/qwen3-32b-target.yaml --dry-run
    python build_scripts/build_engine.py --spec engines/demo-target-fp8.yaml --eval-problems 100

The plan (FP8 quantization with ModelOpt, the LLM-API options YAML = ``trtllm-serve --config`` file, serve
scripts; or the legacy ``quantize.py`` + ``trtllm-build`` commands for ``--runtime trt-engine``) is computed by
:mod:`lookahead_reasoning.production.engine_build`; ``--dry-run`` prints every command and file without running
anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lookahead_reasoning.production.engine_build import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
