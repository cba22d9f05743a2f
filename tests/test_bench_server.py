"""``bench`` end to end against a real server (tiny profile): over Triton gRPC and over the OpenAI front's chat
endpoint, the same document, tables on stdout, plots and genai-perf-style exports. Loopback only, bounded."""

from __future__ import annotations

import json

import pytest
from lookahead_reasoning.cli import main

pytestmark = pytest.mark.server


@pytest.mark.parametrize("endpoint", ["triton-grpc", "openai-chat", "openai-completions"])
def test_bench_against_the_server(endpoint, tiny_server, tiny_openai, tmp_path, capsys):
    url = tiny_server.grpc_url if endpoint.startswith("triton") else f"http://{tiny_openai}/v1"
    out = tmp_path / "bench.json"
    rc = main(["bench", "--url", url, "--endpoint", endpoint, "--concurrency", "1,2", "--requests", "2",
               "--modes", "ar,lr+sd", "--max-tokens", "16", "--slo", "ttft_ms=60000,e2e_ms=60000", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["endpoint"] == endpoint and len(doc["runs"]) == 4
    for r in doc["runs"]:
        assert r["completed"] == 2 and r["failed"] == 0, r.get("errors")
        assert 0 < r["osl"]["min"] <= r["osl"]["max"] <= 16  # output tokens as the server counted them
        assert r["isl"]["min"] > 0 and r["total_tokens_per_s"] > r["output_tokens_per_s"] > 0
        assert r["ttft_ms"]["p95"] is not None and r["e2e_ms"]["std"] is not None
    stdout = capsys.readouterr().out
    assert "| lr+sd | c=2 |" in stdout and "ISL / OSL" in stdout  # the tables are the command's output
    exported = sorted((tmp_path / "bench_genai_perf").glob("*.json"))
    assert len(exported) == 4
    assert json.loads(exported[0].read_text())["input_config"]["endpoint"] == endpoint
    assert sorted(p.name for p in (tmp_path / "bench_plots").glob("*.png")) == [
        "goodput_speedup.png", "latency_cdf.png", "latency_vs_load.png"]


def test_bench_where_every_request_fails_exits_nonzero_saying_why(tiny_openai, tmp_path, capsys):
    """A model the front does not serve: every request gets 404, so nothing was measured; the command says so on
    stderr, naming the load point and the error, and exits 1 (the report is still written)."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "--url", f"http://{tiny_openai}/v1", "--endpoint", "openai-chat", "--model", "nope",
               "--concurrency", "1", "--requests", "2", "--modes", "ar", "--max-tokens", "8", "--out", str(out),
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "error: ar at concurrency 1: all 2 requests failed" in err and "nope" in err, err
    assert "UserWarning" not in err
    assert json.loads(out.read_text())["runs"][0]["completed"] == 0
