"""The OpenAI-compatible backend against a server this project did not write: llama-cpp-python's
``python -m llama_cpp.server`` serving the smollm2 profile's GGUF (SmolLM2-135M-Instruct, Q4_1), flavor ``llama-cpp``.

That server takes text prompts and returns text only, cuts stop strings out of its output and has non-neutral
sampling defaults; the backend sends decoded prompts, re-encodes the output, cuts stops client-side and sends
neutral sampling fields (backends/openai_http.py, module docstring). These tests check the engine interface through
it: the server sees exactly the prompt ids the client holds (its own ``/extras/tokenize``), greedy output equals
llama-cpp-python's own in-process greedy completion of the same prompt (the same library and kernels, one token per
decode call on both sides; equal token for token here, though the server reuses the previous request's KV for a
shared prefix, so under llama.cpp's batch variance an answer could depend on the request before it), EOS and stop
strings follow the engine contract, seeded
sampling repeats, and bad requests raise ``ValueError`` naming the field while the server keeps serving.

Needs the ``llamacpp`` extra with its server dependencies (``make test`` installs them and sets
``LOOKAHEAD_REQUIRE_LLAMACPP=1``, which turns a missing ``llama_cpp`` into a failure instead of a skip).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from lookahead_reasoning.backends.base import GenerationRequest, SamplingParams

if os.environ.get("LOOKAHEAD_REQUIRE_LLAMACPP") == "1":
    import llama_cpp.server.app  # noqa: F401 - make test installs it: missing is a failure
else:
    pytest.importorskip("llama_cpp.server.app", reason="the llamacpp extra (with its server deps) is not installed")

from conftest import BAD_REQUESTS, GSM8K_SAMPLE, concurrent_outputs  # noqa: E402
from lookahead_reasoning.backends.openai_http import OpenAIEngine, OpenAIEngineConfig  # noqa: E402
from lookahead_reasoning.profiles import PROFILES  # noqa: E402
from lookahead_reasoning.serving.server import free_port  # noqa: E402

pytestmark = pytest.mark.server  # llama_cpp.server, started once for the module

N_CTX = 2048
NEW = 24


@pytest.fixture(scope="module")
def paths():
    spec = PROFILES["smollm2-llamacpp"].target
    return str(spec.located_path()), str(spec.resolved_path())


@pytest.fixture(scope="module")
def server(paths, tmp_path_factory):
    """``python -m llama_cpp.server`` on 127.0.0.1 (free port), one thread; stopped after the module."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama_cpp_server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", paths[0], "--model_alias", "smollm2",
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", "1",
             "--n_threads_batch", "1", "--verbose", "False"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"llama_cpp.server did not answer in 90 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def client(server, paths):
    c = OpenAIEngine(OpenAIEngineConfig(url=server, tokenizer=paths[1], flavor="llama-cpp", timeout_s=120,
                                        context_length=N_CTX))
    yield c
    c.close()


@pytest.fixture(scope="module")
def prompts(client):
    from lookahead_reasoning.evaluation.answers import load_items

    return [client.apply_chat_template([{"role": "user", "content": it.prompt}])
            for it in load_items(str(GSM8K_SAMPLE), 4)]


@pytest.fixture(scope="module")
def local(paths):
    """llama-cpp-python in this process on the same GGUF: ``complete(prompt_text, n)`` -> (text, finish_reason)."""
    from llama_cpp import Llama

    llm = Llama(paths[0], n_ctx=N_CTX, n_threads=1, n_threads_batch=1, verbose=False)

    def complete(text: str, n: int, **kw) -> tuple[str, str]:
        out = llm.create_completion(text, max_tokens=n, temperature=0.0, repeat_penalty=1.0, **kw)
        return out["choices"][0]["text"], out["choices"][0]["finish_reason"]

    yield complete
    llm.close()


def _text(client, ids) -> str:
    return client.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_client_reads_limits_and_the_served_model(client, paths):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths[1])
    assert client.model_name == "smollm2"
    assert client.context_length == N_CTX and client.vocab_size >= len(tok)
    assert tok.eos_token_id in client.eos_token_ids


def test_server_tokenizes_the_sent_prompt_to_the_same_ids(client, server, prompts):
    """The text sent for each prompt is tokenized by the server (special tokens recognised) into the client's ids."""
    for ids in prompts:
        r = httpx.post(f"{server}/extras/tokenize", json={"input": _text(client, ids)}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == list(ids)


def test_greedy_equals_llama_cpp_python_in_process(client, prompts, local):
    results = client.generate([GenerationRequest(ids, NEW) for ids in prompts])
    for ids, res in zip(prompts, results, strict=False):
        text, finish = local(_text(client, ids), NEW)
        assert res.text == text
        assert res.token_ids == client.encode(text)[:NEW] + ([client._eos_id] if finish == "stop" else [])
        assert res.finish_reason == ("eos" if finish == "stop" else "length")


def test_eos_is_appended_when_the_server_stops(client, local):
    ids = client.apply_chat_template([{"role": "user", "content": "Reply with the single word: yes"}])
    text, finish = local(_text(client, ids), 64)
    assert finish == "stop", "the model should answer in fewer than 64 tokens"
    res = client.generate([GenerationRequest(ids, 64)])[0]
    assert res.finish_reason == "eos" and res.token_ids[-1] in client.eos_token_ids
    assert res.text == text and client.decode(res.token_ids[:-1]) == text


def test_stop_strings_are_cut_client_side_and_kept(client, prompts, local):
    text, _ = local(_text(client, prompts[0]), 40)
    stop = text[6:8]
    assert stop.strip(), f"continuation too short to pick a stop string: {text!r}"
    res = client.generate([GenerationRequest(prompts[0], 40, stop=(stop,))])[0]
    assert res.finish_reason == "stop"
    assert stop in res.text and stop not in client.decode(res.token_ids[:-1])
    assert text.startswith(res.text)


def test_concurrent_calls_queue_and_stay_separate(client, prompts):
    reqs = [GenerationRequest(ids, 12) for ids in prompts]
    want = [r.token_ids for r in client.generate(reqs)]
    via_asyncio, via_threads = concurrent_outputs(client, reqs)
    assert via_asyncio == via_threads == want


def test_sampling_is_seeded(client, prompts):
    def run(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=seed)
        return [r.token_ids for r in client.generate([GenerationRequest(ids, 16, sampling=params) for ids in prompts])]

    a = run(7)
    assert a == run(7)
    assert any(run(s) != a for s in (8, 9)), "three seeds gave identical samples of 4 x 16 tokens"


@pytest.mark.parametrize("kwargs, field", BAD_REQUESTS)
def test_bad_requests_raise_and_server_keeps_serving(client, prompts, kwargs, field):
    args = {"prompt_ids": prompts[0], "max_new_tokens": 8}
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        client.generate([GenerationRequest(**args)])
    assert len(client.generate([GenerationRequest(prompts[0], 8)])[0].token_ids) >= 1


def test_make_engine_openai_runtime_with_the_llama_cpp_flavor(server, paths, client, prompts):
    from lookahead_reasoning.backends import make_engine
    from lookahead_reasoning.profiles import ModelSpec

    eng = make_engine(ModelSpec(path=paths[1], runtime="openai", url=server + "/v1", server_flavor="llama-cpp"))
    try:
        assert eng.generate([GenerationRequest(prompts[1], 12)])[0].token_ids == \
            client.generate([GenerationRequest(prompts[1], 12)])[0].token_ids
    finally:
        eng.close()
