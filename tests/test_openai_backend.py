"""The OpenAI-compatible backend against our own HTTP server (serving.engine_http) over the portable engine.

A real server on 127.0.0.1 (free port) serves a real small model (the tiny random Qwen3 of conftest.py and,
when present, the demo target); the same greedy equivalence checks as tests/test_engine.py: OpenAI backend ==
portable engine == transformers generate. Bad input -> ValueError naming the field (client side), HTTP 400
naming the field (server side), and the server keeps serving.
"""

from __future__ import annotations

import httpx
import pytest
from conftest import BAD_REQUESTS, DEMO, TEXTS, concurrent_outputs, cut_at_eos, greedy_reference
from lookahead_reasoning.backends.base import GenerationRequest, SamplingParams
from lookahead_reasoning.backends.openai_http import OpenAIEngine, OpenAIEngineConfig, completion_body
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.serving.engine_http import start_server

MODELS = ["tiny", pytest.param("demo", marks=pytest.mark.skipif(not (DEMO / "target" / "config.json").exists(),
                                                                 reason="engines/demo/target not built yet"))]


@pytest.fixture(scope="module", params=MODELS)
def stack(request, tiny_model_dir):
    """(model dir, portable engine, server handle, OpenAI client engine)."""
    model_dir = str(tiny_model_dir) if request.param == "tiny" else str(DEMO / "target")
    engine = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32")
    server = start_server(engine, model_name=request.param)
    client = OpenAIEngine(OpenAIEngineConfig(url=server.url, tokenizer=model_dir, flavor="lookahead", timeout_s=120))
    yield model_dir, engine, server, client
    client.close()
    server.stop()
    engine.close()


@pytest.fixture(scope="module")
def reference(stack):
    """Plain ``model.generate`` greedy continuations (no EOS stop), 24 new tokens each."""
    return greedy_reference(stack[0])


def test_client_reads_limits_from_the_checkpoint(stack):
    _, engine, _, client = stack
    assert client.model_name in ("tiny", "demo")
    assert client.eos_token_ids == engine.eos_token_ids
    assert client.vocab_size == engine.vocab_size and client.context_length == engine.context_length
    assert client.encode("Step 1") == engine.encode("Step 1")
    msgs = [{"role": "user", "content": "2 + 2?"}]
    assert client.apply_chat_template(msgs) == engine.apply_chat_template(msgs)


def test_greedy_equals_portable_and_transformers(stack, reference):
    _, engine, _, client = stack
    reqs = [GenerationRequest(ids, 24) for ids, _ in reference]
    via_http = client.generate(reqs)
    local = engine.generate(reqs)
    for (_ids, ref), h, loc in zip(reference, via_http, local, strict=False):
        assert h.token_ids == loc.token_ids == cut_at_eos(engine, ref)
        assert h.finish_reason == loc.finish_reason
        assert h.text == loc.text


def test_asyncio_and_threads_interleave(stack, reference):
    _, engine, _, client = stack
    reqs = [GenerationRequest(ids, 24) for ids, _ in reference]
    want = [cut_at_eos(engine, ref) for _, ref in reference]
    via_asyncio, via_threads = concurrent_outputs(client, reqs * 2, timeout_s=60)
    assert via_asyncio == via_threads == want * 2


def test_stop_string_completing_token_stays(stack):
    _, engine, _, client = stack
    # a trace prefix: the demo target goes on
    ids = engine.encode("Given: Mia has 4 boxes.\n\nMia has 4 x 2 = 8 pencils.\n\n")
    free = engine.generate([GenerationRequest(ids, 40)])[0]
    assert len(free.text) >= 8, free.text
    stop = free.text[5:7]
    local = engine.generate([GenerationRequest(ids, 40, stop=(stop,))])[0]
    remote = client.generate([GenerationRequest(ids, 40, stop=(stop,))])[0]
    assert remote.finish_reason == local.finish_reason == "stop"
    assert remote.token_ids == local.token_ids
    assert stop in remote.text and stop not in client.decode(remote.token_ids[:-1])


def test_sampling_is_seeded_and_matches_local(stack, reference):
    _, engine, _, client = stack
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=7)
    reqs = [GenerationRequest(ids, 16, sampling=params) for ids, _ in reference]
    a = [r.token_ids for r in client.generate(reqs)]
    assert a == [r.token_ids for r in client.generate(reqs)]
    assert a == [r.token_ids for r in engine.generate(reqs)]


@pytest.mark.parametrize("kwargs, field", BAD_REQUESTS)
def test_bad_requests_raise_and_server_keeps_serving(stack, reference, kwargs, field):
    _, engine, _, client = stack
    args = {"prompt_ids": reference[0][0], "max_new_tokens": 8}
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        client.generate([GenerationRequest(**args)])
    good = client.generate([GenerationRequest(reference[0][0], 8)])[0]
    assert good.token_ids == cut_at_eos(engine, reference[0][1][:8])


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [10**6]}, "prompt"),
        ({"prompt": [1, "x"]}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -5}, "seed"),
        ({"stop": [""]}, "stop"),
        ({"stream": True}, "stream"),
        ({"n": 2}, "n"),
        ({"logprobs": 1}, "logprobs"),
        ({"bogus": 1}, "bogus"),
        ({"model": "other"}, "model"),
    ],
)
def test_server_rejects_bad_input_naming_the_field(stack, reference, body, field):
    _, engine, server, client = stack
    payload = {"model": client.model_name, "prompt": list(reference[0][0]), "max_tokens": 4, "temperature": 0}
    payload.update(body)
    r = httpx.post(f"{server.url}/v1/completions", json=payload, timeout=30)
    assert r.status_code == (404 if field == "model" else 400), r.text
    err = r.json()["error"]
    assert err["param"] == field and err["message"].startswith(f"{field}:")
    ok = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
        "model": client.model_name, "prompt": list(reference[0][0]), "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200
    assert ok.json()["choices"][0]["token_ids"] == cut_at_eos(engine, reference[0][1][:4])


def test_openai_python_client_and_text_prompts(stack, reference):
    """The official `openai` client talks to the server; text prompts, batches and vLLM-style fields work."""
    openai = pytest.importorskip("openai")
    _, engine, server, client = stack
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in api.models.list().data] == [client.model_name]
    res = api.completions.create(model=client.model_name, prompt=TEXTS[0], max_tokens=6, temperature=0,
                                 extra_body={"return_token_ids": True})
    choice = res.choices[0].model_dump()
    assert choice["prompt_token_ids"] == engine.encode(TEXTS[0])
    assert choice["token_ids"] == cut_at_eos(engine, reference[0][1][:6])
    assert res.usage.completion_tokens == len(choice["token_ids"])
    batch = api.completions.create(model=client.model_name, prompt=[list(reference[1][0]), list(reference[2][0])],
                                   max_tokens=4, temperature=0)
    assert [c.model_dump()["token_ids"] for c in batch.choices] == [
        cut_at_eos(engine, reference[k][1][:4]) for k in (1, 2)]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        api.completions.create(model=client.model_name, prompt="x", max_tokens=-1)
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_make_engine_openai_runtime(stack, reference):
    from lookahead_reasoning.backends import make_engine
    from lookahead_reasoning.profiles import ModelSpec

    model_dir, engine, server, _ = stack
    with pytest.raises(ValueError, match="url: runtime 'openai' needs `url`"):
        make_engine(ModelSpec(path=model_dir, runtime="openai"))
    eng = make_engine(ModelSpec(path=model_dir, runtime="openai", url=server.url + "/v1", server_flavor="lookahead"))
    try:
        res = eng.generate([GenerationRequest(reference[3][0], 24)])[0]
        assert res.token_ids == cut_at_eos(engine, reference[3][1])
    finally:
        eng.close()


def test_request_bodies_per_server_flavor():
    req = GenerationRequest((5, 6), 10, stop=("\n\n",))
    vllm = completion_body(req, "m", "vllm")
    assert vllm == {"model": "m", "prompt": [5, 6], "max_tokens": 10, "temperature": 0.0, "top_k": 1,
                    "stop": ["\n\n"], "include_stop_str_in_output": True, "return_token_ids": True}
    trt = completion_body(req, "m", "trtllm-serve")
    assert "return_token_ids" not in trt and trt["include_stop_str_in_output"] is True
    plain = completion_body(GenerationRequest((5,), 3, sampling=SamplingParams(temperature=0.5, top_k=3, seed=1)),
                            "m", "openai")
    assert plain == {"model": "m", "prompt": [5], "max_tokens": 3, "temperature": 0.5, "top_p": 1.0, "seed": 1}
    # llama_cpp.server: text prompt, no stop (it would cut the stop out of the text), neutral sampling defaults
    lcpp = completion_body(req, "m", "llama-cpp", prompt_text="ab")
    assert lcpp == {"model": "m", "prompt": "ab", "max_tokens": 10, "temperature": 0.0, "top_k": 1,
                    "repeat_penalty": 1.0, "min_p": 0.0}
    sampled = completion_body(GenerationRequest((5,), 3, sampling=SamplingParams(temperature=0.5, seed=1)), "m",
                              "llama-cpp", prompt_text="ab")
    assert sampled["top_k"] == 0 and sampled["top_p"] == 1.0 and sampled["seed"] == 1
    with pytest.raises(ValueError, match="prompt"):
        completion_body(req, "m", "llama-cpp")
