#!/usr/bin/env python3
"""Container health check: exit 0 when GET URL answers 200 (default: Triton readiness on :8000).

Usage: healthcheck.py [URL]   e.g. http://localhost:8001/health for a trtllm-serve role container.
"""
import sys
import urllib.request

url = sys.argv[1] if len(sys.argv) > 1 else "http://localhost:8000/v2/health/ready"
try:
    with urllib.request.urlopen(url, timeout=5) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception as exc:  # noqa: BLE001 - any failure is "unhealthy"
    print(f"unhealthy: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
