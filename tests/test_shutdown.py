"""Shutdown of a real Triton server: every model unloads and no Python-backend stub dies on the way out.

Before ``finalize`` freed the custom metric families, one to four stubs (the orchestrator's and the role models') died
with SIGSEGV at every shutdown, inside ``MetricFamily::~MetricFamily`` (``ServerMetrics.close`` says why). The BLS
responses the orchestrator holds (``triton_bls.DeferredRelease``) did the same in 3 of 3 runs until ``finalize``
dropped them too.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import start_server
from lookahead_reasoning.serving.client import TritonLRClient

pytestmark = pytest.mark.server

MODELS = ("lookahead_reasoning", "target", "draft", "judge")


def test_stubs_exit_cleanly_after_serving(tmp_path_factory, tiny_profile_yaml):
    server = start_server(tmp_path_factory, tiny_profile_yaml)
    try:
        client = TritonLRClient(server.http_url, "http")  # (gRPC streams can keep the model live: README)
        for mode in ("ar", "lr+sd"):
            answer = asyncio.run(client.generate("Tom has 3 apples.", mode=mode, max_tokens=16))
            assert answer.metrics["generated_tokens"] > 0
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "Segmentation fault" not in log and "Fatal Python error" not in log, log[-3000:]
    for model in MODELS:
        assert f"successfully unloaded '{model}'" in log, (model, log[-3000:])
