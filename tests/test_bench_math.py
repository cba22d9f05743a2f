"""Serving-metric math on constructed timelines with known answers, and the load generator end to end.

The runner is driven by an in-process ``send`` coroutine that sleeps known amounts: that is the transport
abstraction under test, not a stand-in for a real component.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np
import pytest
from lookahead_reasoning.benchmarking.bench import (
    BenchConfig,
    RequestTimeline,
    client_send,
    config_from_args,
    meets_slo,
    parse_list,
    parse_runs,
    parse_slo,
    percentiles_ms,
    poisson_arrivals,
    register,
    run_bench,
    run_load,
    run_request,
    summarize,
)
from lookahead_reasoning.evaluation.answers import EvalItem


def tl(send, chunks, tokens, end=None, ok=True):
    return RequestTimeline(send_s=send, chunk_s=list(chunks), chunk_tokens=list(tokens),
                           end_s=end if end is not None else (chunks[-1] if chunks else send), ok=ok)


def test_single_request_ttft_itl_tpot_e2e():
    t = tl(10.0, [10.1, 10.3, 10.6], [5, 10, 5], end=10.6)
    assert t.output_tokens == 20
    assert t.ttft_s == pytest.approx(0.1)
    assert t.itl_s == pytest.approx([0.2, 0.3])
    assert t.e2e_s == pytest.approx(0.6)
    assert t.tpot_s == pytest.approx((0.6 - 0.1) / 19)  # (e2e - ttft) / (tokens - 1)


def test_tpot_undefined_for_one_token_and_excluded_but_counts_as_zero_for_goodput():
    one = tl(0.0, [0.5], [1], end=0.5)
    assert one.tpot_s is None and one.itl_s == []
    s = summarize([one, tl(0.0, [0.1, 0.2], [1, 1], end=0.2)], {"tpot_ms": 0.001})
    assert s["tpot_ms"]["p50"] == pytest.approx(100.0)  # only the 2-token request: (0.2-0.1)/1
    # vLLM: tpot of a <=1-token request is 0 for goodput, so it meets any TPOT SLO; the other misses it.
    assert meets_slo(one, {"tpot_ms": 0.001})
    assert s["goodput_rps"] == pytest.approx(1 / 0.5)


def test_percentiles_numpy_linear_interpolation():
    p = percentiles_ms([1.0, 2.0, 3.0, 4.0])
    # linear interpolation at rank q/100 * (n-1): p50 -> 1.5 -> 2.5 s; p90 -> 2.7 -> 3.7 s; p99 -> 2.97 -> 3.97 s
    assert p["p50"] == pytest.approx(2500.0)
    assert p["p90"] == pytest.approx(3700.0)
    assert p["p99"] == pytest.approx(3970.0)
    assert p["mean"] == pytest.approx(2500.0)
    assert p["std"] == pytest.approx(np.std([1000.0, 2000.0, 3000.0, 4000.0]))
    assert (p["min"], p["max"], p["p95"]) == (1000.0, 4000.0, pytest.approx(3850.0))
    assert percentiles_ms([]) == dict.fromkeys(["mean", "std", "min", "max", "p50", "p90", "p95", "p99"])


def test_run_summary_itl_pooled_throughput_goodput_and_failures():
    runs = [
        tl(0.0, [0.1, 0.2, 0.4], [4, 4, 4], end=0.4),   # ttft 100, itl 100/200, e2e 400, tpot 300/11 ms
        tl(0.5, [0.8, 1.0], [6, 6], end=1.0),           # ttft 300, itl 200, e2e 500, tpot 200/11 ms
        tl(1.0, [1.05, 1.35, 1.95], [2, 2, 2], end=2.0),  # ttft 50, itl 300/600, e2e 1000, tpot 950/5 = 190 ms
        tl(1.5, [], [], end=1.6, ok=False),             # failed: counted in duration only
    ]
    s = summarize(runs, {"ttft_ms": 200, "e2e_ms": 600})
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["duration_s"] == pytest.approx(2.0)  # first send 0.0 to last completion 2.0
    assert s["output_tokens"] == 30
    assert s["output_tokens_per_s"] == pytest.approx(15.0)
    assert s["requests_per_s"] == pytest.approx(1.5)
    itl = np.array([100, 200, 200, 300, 600], float)
    assert s["itl_ms"]["p50"] == pytest.approx(np.percentile(itl, 50)) == pytest.approx(200.0)
    assert s["itl_ms"]["p99"] == pytest.approx(np.percentile(itl, 99))
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert s["e2e_ms"]["p90"] == pytest.approx(np.percentile([400, 500, 1000], 90))
    assert s["tpot_ms"]["p50"] == pytest.approx(np.percentile([300 / 11, 200 / 11, 190], 50))
    # SLO ttft <= 200 and e2e <= 600: request 1 meets both, 2 misses TTFT, 3 misses E2E -> 1 good / 2.0 s
    assert s["goodput_rps"] == pytest.approx(0.5)
    assert summarize(runs)["goodput_rps"] is None  # no SLO given
    assert meets_slo(runs[0], {"ttft_ms": 100.0})  # boundary is inclusive (<=), as vLLM


def test_zero_token_chunks_do_not_count_but_end_the_stream():
    async def send(item, mode):
        yield "step one. ", 3
        await asyncio.sleep(0.01)
        yield "", 0, {"verified_steps": 4, "accepted_steps": 3}  # metrics-only final response

    (t,) = asyncio.run(run_load(send, [EvalItem("a", "synthetic", "q")], "lr", 1, concurrency=1, progress=False))
    assert t.chunk_tokens == [3] and t.itl_s == []
    assert t.e2e_s > t.ttft_s + 0.009
    assert summarize([t])["acceptance_rate"] == pytest.approx(0.75)


def test_poisson_arrivals_deterministic_and_exponential():
    a, b = poisson_arrivals(50, 4.0, seed=7), poisson_arrivals(50, 4.0, seed=7)
    assert np.array_equal(a, b) and a[0] == 0.0 and np.all(np.diff(a) > 0)
    assert not np.array_equal(a, poisson_arrivals(50, 4.0, seed=8))
    gaps = np.diff(poisson_arrivals(20000, 4.0, seed=1))
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)  # mean gap 1/rate
    assert gaps.std() == pytest.approx(0.25, rel=0.05)   # exponential: std == mean
    assert np.all(poisson_arrivals(5, float("inf")) == 0)


def test_slo_parsing_and_errors_name_the_key():
    assert parse_slo("ttft_ms=500, tpot_ms=50,e2e_ms=20000") == {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2e_ms": 20000.0}
    assert parse_slo("ttft=1,e2el=2") == {"ttft_ms": 1.0, "e2e_ms": 2.0}  # vLLM's --goodput keys
    assert parse_slo(None) == {}
    for text, needle in (("ttfx_ms=5", "'ttfx_ms'"), ("ttft_ms=abc", "ttft_ms"), ("tpot_ms=-1", "tpot_ms"),
                         ("e2e_ms=0", "e2e_ms"), ("ttft_ms", "KEY=VALUE"),
                         ("ttft_ms=1,ttft_ms=2", "ttft_ms given twice"), ("e2e_ms=nan", "e2e_ms")):
        with pytest.raises(ValueError, match="--slo") as exc:
            parse_slo(text)
        assert needle in str(exc.value)
    assert parse_list("1,4,16", int, "--concurrency") == [1, 4, 16]
    with pytest.raises(ValueError, match="--concurrency"):
        parse_list("1,x", int, "--concurrency")
    with pytest.raises(ValueError, match="--request-rate"):
        parse_list("0", float, "--request-rate")


ITEMS = [EvalItem(f"q{i}", "synthetic", f"question {i}") for i in range(3)]


def sleepy_send(ttft=0.03, gap=0.01, chunks=3, tokens=4):
    async def send(item, mode):
        await asyncio.sleep(ttft)
        for k in range(chunks):
            if k:
                await asyncio.sleep(gap)
            yield f"step {k}\n\n", tokens
    return send


def test_runner_concurrency_timing_and_items_cycled():
    seen = []

    async def send(item, mode):
        seen.append(item.id)
        async for x in sleepy_send()(item, mode):
            yield x

    t1 = asyncio.run(run_load(send, ITEMS, "ar", 4, concurrency=1, progress=False))
    assert seen == ["q0", "q1", "q2", "q0"]
    for t in t1:
        assert t.completed and t.output_tokens == 12
        assert 0.03 <= t.ttft_s < 0.03 + 0.1
        assert all(0.01 <= g < 0.01 + 0.1 for g in t.itl_s)
    s1 = summarize(t1)
    assert s1["duration_s"] >= 4 * 0.05  # one at a time: 4 requests x (30 + 2 x 10) ms
    # all sends of a closed loop at concurrency 1 follow the previous completion
    assert all(b.send_s >= a.end_s for a, b in zip(t1, t1[1:], strict=False))
    t4 = asyncio.run(run_load(sleepy_send(), ITEMS, "ar", 4, concurrency=4, progress=False))
    assert summarize(t4)["duration_s"] < s1["duration_s"] * 0.75
    assert max(t.send_s for t in t4) - min(t.send_s for t in t4) < 0.02  # all four in flight at once


def test_runner_poisson_open_loop_never_early_and_unbounded_in_flight():
    offsets = poisson_arrivals(12, 200.0, seed=3)
    reads: list[float] = []

    def clock() -> float:  # the runner's first reading is its start (request 0 itself may start later, on a busy CPU)
        reads.append(time.perf_counter())
        return reads[-1]

    tls = asyncio.run(run_load(sleepy_send(ttft=0.05), ITEMS, "lr+sd", 12, request_rate=200.0, seed=3, progress=False,
                               clock=clock))
    start = reads[0]
    for t, off in zip(tls, offsets, strict=False):
        assert t.send_s - start >= off - 1e-3  # never sent before its arrival time
    in_flight = max(sum(u.send_s <= t.send_s < u.end_s for u in tls) for t in tls)
    assert in_flight > 1  # open loop: arrivals do not wait for completions


def test_runner_records_failures_and_goes_on():
    async def send(item, mode):
        yield "x", 1
        if item.id == "q1":
            raise ConnectionError("server went away")
        yield "y", 1

    tls = asyncio.run(run_load(send, ITEMS, "ar", 3, concurrency=2, progress=False))
    assert [t.ok for t in tls] == [True, False, True]
    s = summarize(tls)
    assert s["completed"] == 2 and s["failed"] == 1 and "ConnectionError: server went away" in s["errors"][0]


def test_run_bench_document_plots_and_summary(tmp_path):
    from lookahead_reasoning.benchmarking.bench_report import export_genai_perf, plot_bench, write_summary

    sent = []

    async def send(item, mode):  # lr+sd streams the same 12 tokens in fewer, faster chunks
        sent.append((item.id, mode))
        fast = mode == "lr+sd"
        async for x in sleepy_send(ttft=0.02, gap=0.005 if fast else 0.01, chunks=2 if fast else 4,
                                   tokens=6 if fast else 3)(item, mode):
            yield x
        yield "", 0, {"prompt_tokens": 7 + len(item.id), "generated_tokens": 12}  # the final metrics response

    cfg = BenchConfig(["ar", "lr+sd"], 4, concurrencies=[1, 2], slo_ms={"ttft_ms": 1000, "e2e_ms": 1000})
    spare = EvalItem("spare", "synthetic", "warm-up question")
    doc = asyncio.run(run_bench(send, ITEMS, cfg, progress=False, warmup_item=spare))
    # one untimed warm-up per mode on the spare item; then c=1 runs ar first, c=2 runs lr+sd first (rotated)
    assert sent[:2] == [("spare", "ar"), ("spare", "lr+sd")]
    assert [m for _, m in sent[2:]] == ["ar"] * 4 + ["lr+sd"] * 4 + ["lr+sd"] * 4 + ["ar"] * 4
    assert all(i != "spare" for i, _ in sent[2:])
    assert [(r["mode"], r["concurrency"]) for r in doc["runs"]] == [("ar", 1), ("lr+sd", 1), ("ar", 2), ("lr+sd", 2)]
    assert [r["order_position"] for r in doc["runs"]] == [0, 1, 1, 0]
    m = doc["measurement"]
    assert m["warmup_requests_per_mode"] == 1 and m["warmup_item"] == "spare" and m["warmup_failed"] == 0
    assert "rotated" in m["order"] and {"load_avg_1min_start", "load_avg_1min_end", "cpu_count"} <= set(m)
    for r in doc["runs"]:
        for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(r[k]) >= {"p50", "p90", "p95", "p99", "mean", "std", "min", "max"}
        assert r["goodput_rps"] == pytest.approx(r["requests_per_s"])  # generous SLOs: every request is good
        assert r["output_tokens"] == 48
    assert doc["runs"][0]["speedup_vs_ar"] == 1.0 and doc["runs"][1]["speedup_vs_ar"] > 1.0
    for r in doc["runs"]:  # ISL / OSL as the server counted them, total token throughput
        assert r["osl"]["mean"] == r["osl"]["min"] == 12 and r["isl"]["min"] >= 9
        assert r["total_tokens_per_s"] == pytest.approx((r["output_tokens"] + r["input_tokens"]) / r["duration_s"])
    json.dumps(doc)  # serialisable as is
    exported = export_genai_perf({**doc, "endpoint": "triton-grpc"}, tmp_path / "genai_perf")
    assert [p.name for p in exported] == ["ar_c1.json", "lr_sd_c1.json", "ar_c2.json", "lr_sd_c2.json"]
    gp = json.loads(exported[1].read_text())
    assert gp["time_to_first_token"]["avg"] == doc["runs"][1]["ttft_ms"]["mean"]
    assert gp["time_to_first_token"]["unit"] == "ms" and gp["output_sequence_length"]["p95"] == 12
    assert gp["input_config"]["mode"] == "lr+sd" and gp["input_config"]["concurrency"] == 1
    pngs = plot_bench(doc, tmp_path / "plots")
    assert [p.name for p in pngs] == ["latency_cdf.png", "latency_vs_load.png", "goodput_speedup.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    md = write_summary({**doc, "dataset": "synthetic"}, tmp_path / "bench.md", pngs).read_text()
    assert "| lr+sd | c=2 |" in md and "ttft_ms <= 1000" in md and "plots/latency_cdf.png" in md
    assert "1-minute load average" in md and "modes rotated per load point" in md
    busy = write_summary({**doc, "measurement": {**m, "warning": "busy machine"}}, tmp_path / "b2.md").read_text()
    assert "**warning: busy machine**" in busy


def test_bench_subcommand_flags_and_validation():
    parser = argparse.ArgumentParser(prog="t")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--url", "localhost:8001", "--endpoint", "triton-http",
                              "--concurrency", "1,4,16", "--requests", "8", "--modes", "ar,lr+sd",
                              "--slo", "ttft_ms=500,tpot_ms=50,e2e_ms=9000", "--out", "x.json"])
    cfg = config_from_args(args)
    assert cfg.warmup == 1 and cfg.mode_order(1) == ["lr+sd", "ar"] and cfg.mode_order(2) == ["ar", "lr+sd"]
    assert cfg.concurrencies == [1, 4, 16] and cfg.modes == ["ar", "lr+sd"] and cfg.slo_ms["tpot_ms"] == 50.0
    assert [x for x in cfg.loads()] == [("concurrency", 1), ("concurrency", 4), ("concurrency", 16)]
    rate = parser.parse_args(["bench", "--url", "h:1", "--request-rate", "2.5", "--requests", "8", "--out", "x.json"])
    assert config_from_args(rate).request_rates == [2.5] and rate.dataset == "synthetic"
    with pytest.raises(SystemExit):  # --concurrency and --request-rate are mutually exclusive
        parser.parse_args(["bench", "--url", "h:1", "--concurrency", "1", "--request-rate", "1", "--out", "x"])
    with pytest.raises(ValueError, match="--modes"):
        config_from_args(parser.parse_args(["bench", "--url", "h:1", "--concurrency", "1", "--modes", "fast",
                                            "--out", "x"]))


def test_client_send_adapts_step_chunks():
    class Chunk:
        def __init__(self, text, n, metrics=None):
            self.text, self.token_count, self.metrics = text, n, metrics

    class Client:
        calls = []

        async def stream(self, prompt=None, messages=None, **params):
            self.calls.append((prompt, messages, params))
            yield Chunk("a\n\n", 2)
            yield Chunk("", 0, {"verified_steps": 1, "accepted_steps": 1})

    send = client_send(Client(), max_tokens=64)
    item = EvalItem("g", "gsm8k", "What is 2+2?", ({"role": "user", "content": "What is 2+2? ..."},), "4")

    async def collect():
        return [x async for x in send(item, "lr+sd")]

    assert asyncio.run(collect()) == [("a\n\n", 2, None), ("", 0, {"verified_steps": 1, "accepted_steps": 1})]
    assert Client.calls == [("What is 2+2?", None, {"mode": "lr+sd", "max_tokens": 64})]


def test_run_variants_add_request_fields():
    assert parse_runs("ar, lr+sd,lr+sd:adaptive") == ["ar", "lr+sd", "lr+sd:adaptive"]
    assert run_request("lr+sd:adaptive") == ("lr+sd", {"adaptive_gamma": True}) and run_request("ar") == ("ar", {})
    for bad in ("ar:adaptive", "lr+sd:fast", "lr+sd,lr+sd", "fast:adaptive"):
        with pytest.raises(ValueError, match="--modes"):
            parse_runs(bad)

    class Client:
        calls = []

        async def stream(self, prompt=None, messages=None, **params):
            self.calls.append(params)
            yield type("C", (), {"text": "x", "token_count": 1, "metrics": None})()

    item = EvalItem("g", "gsm8k", "What is 2+2?", ({"role": "user", "content": "What is 2+2?"},), "4")

    async def drain(run):
        return [c async for c in client_send(Client(), max_tokens=8)(item, run)]

    asyncio.run(drain("lr+sd:adaptive"))
    asyncio.run(drain("ar"))
    assert Client.calls == [{"mode": "lr+sd", "adaptive_gamma": True, "max_tokens": 8}, {"mode": "ar", "max_tokens": 8}]
