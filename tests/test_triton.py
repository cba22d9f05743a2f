"""End to end through a real Triton server with the demo trio: gRPC streaming, HTTP generate, the OpenAI
front, equality with in-process output, and concurrent streams."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from lookahead_reasoning.answers import load_items
from lookahead_reasoning.lookahead import with_overrides
from lookahead_reasoning.serving.client import ServerError, TritonLRClient

pytestmark = pytest.mark.server

MAX_TOKENS = 120


@pytest.fixture(scope="module")
def items(gsm8k_path):
    return load_items("synthetic", 5) + load_items(str(gsm8k_path), 5)


@pytest.fixture(scope="module")
def in_process():
    """The same demo trio in-process (the reference for equality)."""
    from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile

    r = build_reasoner(load_profile("demo"))
    yield r
    close_reasoner(r)


def _run(coro):
    return asyncio.run(coro)


def test_grpc_streaming_pieces_make_the_answer(triton_server, items):
    client = TritonLRClient(triton_server.grpc_url, "grpc")

    async def go():
        out = []
        for item in items:
            chunks = [c async for c in client.stream(item.prompt, max_tokens=MAX_TOKENS)]
            whole = await client.generate(item.prompt, max_tokens=MAX_TOKENS)
            out.append((chunks, whole))
        return out

    for chunks, whole in _run(go()):
        final = chunks[-1]
        assert final.metrics is not None and final.text == ""
        steps = chunks[:-1]
        assert steps and all(c.metrics is None and c.source in ("draft", "target") for c in steps)
        assert "".join(c.text for c in steps) == whole.text
        assert sum(c.token_count for c in steps) == final.metrics["generated_tokens"] == whole.metrics["generated_tokens"]
        assert final.metrics["mode"] == "lr+sd" and final.metrics["cycles"] >= 1


def test_http_generate_and_generate_stream(triton_server, items):
    grpc = TritonLRClient(triton_server.grpc_url, "grpc")
    http = TritonLRClient(triton_server.http_url, "http")

    async def go():
        out = []
        for item in items[:3] + items[5:7]:
            ref = await grpc.generate(item.prompt, max_tokens=MAX_TOKENS)
            plain = await http.generate(item.prompt, max_tokens=MAX_TOKENS)
            streamed = await http.generate(item.prompt, max_tokens=MAX_TOKENS, stream=True)
            out.append((ref, plain, streamed))
        return out

    for ref, plain, streamed in _run(go()):
        assert plain.text == streamed.text == ref.text
        assert plain.metrics["generated_tokens"] == ref.metrics["generated_tokens"]


def test_openai_front(openai_front, items):
    import openai

    client = openai.OpenAI(base_url=f"http://{openai_front}/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["demo"]
    item = items[0]
    done = client.completions.create(model="demo", prompt=item.prompt, max_tokens=MAX_TOKENS)
    assert done.choices[0].text and done.usage.completion_tokens > 0
    pieces = [c.choices[0].text for c in
              client.completions.create(model="demo", prompt=item.prompt, max_tokens=MAX_TOKENS, stream=True)]
    assert "".join(pieces) == done.choices[0].text
    chat = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": item.prompt}],
                                          max_tokens=MAX_TOKENS)
    assert chat.choices[0].message.content == done.choices[0].text  # a prompt is sent as one user message
    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": items[6].prompt}],
                                            max_tokens=MAX_TOKENS, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text
    with pytest.raises(openai.BadRequestError, match="gamma"):
        client.completions.create(model="demo", prompt="x", max_tokens=8, extra_body={"gamma": -1})


def test_openai_front_leaves_the_stop_string_out(openai_front, items):
    """As OpenAI and vLLM: the matched stop string is not in the text (vLLM's include_stop_str_in_output keeps
    it), streamed or not."""
    import openai

    client = openai.OpenAI(base_url=f"http://{openai_front}/v1", api_key="unused")
    prompt, ar = items[0].prompt, {"mode": "ar"}  # ar: the same text with and without the stop (lr's judge may differ)
    free = client.completions.create(model="demo", prompt=prompt, max_tokens=60, extra_body=ar).choices[0].text
    stop = free[25:30]
    cut = free.find(stop)
    done = client.completions.create(model="demo", prompt=prompt, max_tokens=60, stop=[stop], extra_body=ar).choices[0]
    assert done.text == free[:cut] and done.finish_reason == "stop"
    kept = client.completions.create(model="demo", prompt=prompt, max_tokens=60, stop=[stop],
                                     extra_body={**ar, "include_stop_str_in_output": True}).choices[0]
    assert kept.text == free[:cut + len(stop)]
    pieces = client.completions.create(model="demo", prompt=prompt, max_tokens=60, stop=[stop], stream=True,
                                       extra_body=ar)
    assert "".join(c.choices[0].text for c in pieces) == free[:cut]


@pytest.mark.parametrize("extra, status, param", [
    ({"model": "nope"}, 404, "model"),
    ({"n": 2}, 400, "n"),
    ({"logprobs": True}, 400, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format"),
])
def test_openai_front_refuses_what_it_does_not_do(openai_front, extra, status, param):
    """An unknown model or a parameter this server does not implement is refused by name, not ignored."""
    import httpx

    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    r = httpx.post(f"http://{openai_front}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert r.json()["error"]["message"].startswith(param)


def test_openai_front_body_that_is_not_json(openai_front):
    """The README's curl without a content type, and a body that is not JSON: HTTP 400 in one sentence, not a
    validation dump naming our source files."""
    import httpx

    url = f"http://{openai_front}/v1/chat/completions"
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "hi"}]})
    for kwargs in ({"content": body}, {"content": "{not json", "headers": {"Content-Type": "application/json"}},
                   {"content": "[1, 2]", "headers": {"Content-Type": "application/json"}}):
        r = httpx.post(url, timeout=30, **kwargs)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["message"].startswith("body: expected a JSON object") and err["param"] == "body"
        assert ".py" not in r.text
    ok = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert ok.status_code == 200


def test_openai_front_splits_reasoning(openai_front, triton_server, items):
    """Chat answers are split by the served profile's reasoning parser, streamed and not, exactly as
    split_reasoning splits the raw text the server generated for the same messages."""
    import openai

    from lookahead_reasoning.steps import split_reasoning

    grpc = TritonLRClient(triton_server.grpc_url, "grpc")
    parser = _run(grpc.server_profile())["parameters"]["reasoning_parser"]
    client = openai.OpenAI(base_url=f"http://{openai_front}/v1", api_key="unused")
    messages = [{"role": "user", "content": items[1].prompt}]
    raw = _run(grpc.generate(None, messages, max_tokens=MAX_TOKENS)).text
    want_reasoning, want_content = split_reasoning(raw, parser)
    msg = client.chat.completions.create(model="demo", messages=messages, max_tokens=MAX_TOKENS).choices[0].message
    got = msg.model_dump()
    assert got.get("reasoning_content") == want_reasoning and msg.content == want_content
    reasoning, content = "", ""
    for c in client.chat.completions.create(model="demo", messages=messages, max_tokens=MAX_TOKENS, stream=True):
        delta = c.choices[0].delta.model_dump()
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    assert reasoning.strip() == (want_reasoning or "") and content.strip() == want_content.strip()


@pytest.mark.parametrize("mode", ["ar", "lr+sd"])
def test_greedy_output_equals_in_process(triton_server, in_process, items, mode):
    client = TritonLRClient(triton_server.grpc_url, "grpc")
    opts = with_overrides(in_process.defaults, mode=mode, max_tokens=MAX_TOKENS)
    for item in items[:3] + items[5:7]:
        local = in_process.run(item.prompt, options=opts)
        remote = _run(client.generate(item.prompt, max_tokens=MAX_TOKENS, mode=mode))
        assert remote.text == local.text
        assert remote.metrics["generated_tokens"] == local.metrics.generated_tokens


@pytest.mark.slow
def test_sixteen_concurrent_streams_do_not_mix(triton_server):
    client = TritonLRClient(triton_server.grpc_url, "grpc")
    items = load_items("synthetic", 16)

    async def one(item):
        chunks = [c async for c in client.stream(item.prompt, max_tokens=80)]
        return chunks

    async def go():
        sequential = [await client.generate(i.prompt, max_tokens=80) for i in items]
        concurrent = await asyncio.gather(*(one(i) for i in items))
        return sequential, concurrent

    sequential, concurrent = _run(go())
    assert len(concurrent) == 16
    for seq, chunks in zip(sequential, concurrent):
        assert chunks[-1].metrics is not None  # completed, exactly one final response
        assert sum(1 for c in chunks if c.metrics is not None) == 1
        assert "".join(c.text for c in chunks) == seq.text  # nothing lost, duplicated or mixed


def test_bad_request_gets_clear_error_and_server_keeps_serving(triton_server, items):
    client = TritonLRClient(triton_server.grpc_url, "grpc")
    with pytest.raises(ServerError, match="max_tokens"):
        _run(client.generate(items[0].prompt, max_tokens=0))
    good = _run(client.generate(items[0].prompt, max_tokens=16))
    assert good.metrics["generated_tokens"] == 16


def test_custom_metrics_exported(triton_server, items):
    _run(TritonLRClient(triton_server.grpc_url, "grpc").generate(items[0].prompt, max_tokens=32))
    body = urllib.request.urlopen(f"http://{triton_server.metrics_url}/metrics", timeout=10).read().decode()
    names = {line.split("{")[0] for line in body.splitlines() if line.startswith("lr_")}
    assert {"lr_requests_total", "lr_steps_total", "lr_cycles_total", "lr_accepted_steps_total",
            "lr_verified_steps_total", "lr_judge_fallbacks_total", "lr_acceptance_rate"} <= names


def test_engine_dtypes_reported(triton_server):
    """Each role model's dtype is resolved inside it and exported; the demo profile pins float32 (overhead-bound
    models, and the same numbers in and out of the server)."""
    assert triton_server.engine_dtypes() == {"draft": "float32", "target": "float32", "judge": "float32"}


def test_server_reports_its_profile(triton_server):
    info = _run(TritonLRClient(triton_server.http_url, "http").server_profile())
    assert info["profile"] == "demo"
    cfg = json.loads(urllib.request.urlopen(
        f"http://{triton_server.http_url}/v2/models/lookahead_reasoning/config", timeout=10).read())
    assert cfg["model_transaction_policy"]["decoupled"] is True
