"""A catalogue of bad requests, each sent through the CLI, the Python API, gRPC, HTTP and the OpenAI front.

Every case must get a clear error naming the field (in that channel's own vocabulary: ``--max-tokens`` on the
command line, ``max_tokens`` elsewhere, ``text_input`` for the prompt on Triton, ``prompt`` on the OpenAI
front), and the server must answer the next good request correctly. Cases that a channel cannot even express
(a wrong tensor dtype on the command line, say) are marked with the channels they apply to.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.core.lookahead import LookaheadReasoner, with_overrides
from lookahead_reasoning.profiles import load_profile
from lookahead_reasoning.serving.client import TritonLRClient

pytestmark = pytest.mark.server

ALL = ("cli", "python", "grpc", "http", "openai")


@dataclass
class Case:
    name: str
    fields: dict  # request fields (Triton input names); "text_input" defaults to a good prompt
    expect: dict  # channel -> substring the error must contain (the field's name in that channel)
    channels: tuple = ALL
    raw: dict = field(default_factory=dict)  # grpc: name -> (numpy array, Triton dtype) overriding fields


def _e(field_name, cli=None, triton=None):
    return {"cli": cli or "--" + field_name.replace("_", "-"), "python": field_name,
            "grpc": triton or field_name, "http": triton or field_name, "openai": field_name}


CASES = [
    Case("empty prompt", {"text_input": ""}, _e("prompt", triton="text_input")),
    Case("whitespace prompt", {"text_input": "  \n\t "}, _e("prompt", triton="text_input")),
    Case("invalid utf-8", {"text_input": "bad \udcff bytes"}, _e("prompt", triton="text_input"),  # not JSON-able
         channels=("cli", "python", "grpc"),
         raw={"text_input": (np.array([b"bad \xff bytes"], dtype=np.object_), "BYTES")}),
    Case("prompt over the context window", {"text_input": "12 " * 700}, _e("prompt", triton="text_input")),
    Case("prompt over the server's byte limit", {"text_input": "x " * 5000},
         {"grpc": "text_input", "http": "text_input", "openai": "prompt"}, channels=("grpc", "http", "openai")),
    Case("max_tokens 0", {"max_tokens": 0}, _e("max_tokens")),
    Case("max_tokens negative", {"max_tokens": -5}, _e("max_tokens")),
    Case("max_tokens absurd", {"max_tokens": 2_000_000_000}, _e("max_tokens")),
    Case("gamma negative", {"gamma": -1}, _e("gamma")),
    Case("gamma zero in an LR mode", {"gamma": 0, "mode": "lr+sd"}, _e("gamma")),
    Case("gamma over the cap", {"gamma": 50}, _e("gamma")),
    Case("unknown mode", {"mode": "turbo"}, _e("mode")),
    Case("unknown judge", {"judge": "oracle"}, _e("judge")),
    Case("temperature negative", {"temperature": -0.5}, _e("temperature")),
    Case("temperature above OpenAI's 2", {"temperature": 5.0}, _e("temperature")),
    Case("top_p zero", {"top_p": 0.0}, _e("top_p")),
    Case("top_p above one", {"top_p": 1.5}, _e("top_p")),
    Case("top_k negative", {"top_k": -3}, _e("top_k")),
    Case("top_k above the vocabulary", {"top_k": 10**6}, _e("top_k")),
    # Over HTTP generate, Triton's own JSON parser rejects a value of the wrong type before any model sees it,
    # with its message ("Unable to parse 'data': ...", not naming the field) and status 500 (Triton 2.51's, not ours).
    Case("non-integer seed", {"seed": 1.5}, {**_e("seed"), "http": "Unable to parse"},
         channels=("cli", "python", "http", "openai")),
    Case("negative seed", {"seed": -7}, _e("seed")),
    Case("empty delimiter", {"delimiter": ""}, _e("delimiter")),
    Case("max_step_tokens zero", {"max_step_tokens": 0}, _e("max_step_tokens")),
    Case("width zero", {"width": 0}, _e("width")),
    Case("empty stop string", {"stop": [""]}, _e("stop")),
    Case("unknown SD method", {"sd_method": "tree"}, _e("sd_method"), channels=("cli", "grpc", "http", "openai")),
    Case("sd_tokens zero", {"sd_tokens": 0}, _e("sd_tokens"), channels=("cli", "grpc", "http", "openai")),
    # the test profile's target has no heads (too many Medusa tokens: tests/test_eagle.py, in-process)
    Case("SD method the target cannot run", {"sd_method": "medusa"}, _e("sd_method"),
         channels=("cli", "grpc", "http", "openai")),
    # The Python API takes parsed messages, so JSON syntax is the caller's business there.
    Case("messages not JSON", {"text_input": None, "messages": "[{role: user"}, _e("messages"),
         channels=("cli", "grpc", "http", "openai")),
    Case("messages with an unknown role", {"text_input": None, "messages": '[{"role": "robot", "content": "hi"}]'},
         _e("messages")),
    Case("messages empty", {"text_input": None, "messages": "[]"}, _e("messages")),
    Case("messages with an image part", {"text_input": None, "messages": json.dumps(
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}])},
         _e("messages")),
    Case("no prompt at all", {"text_input": None}, {"grpc": "text_input", "http": "text_input", "openai": "prompt"},
         channels=("grpc", "http", "openai")),
    Case("wrong dtype: max_tokens as FP32", {}, {"grpc": "max_tokens"}, channels=("grpc",),
         raw={"max_tokens": (np.array([8.0], dtype=np.float32), "FP32")}),
    Case("wrong dtype: text_input as INT32", {}, {"grpc": "text_input"}, channels=("grpc",),
         raw={"text_input": (np.array([3], dtype=np.int32), "INT32")}),
    Case("wrong shape: gamma [2]", {}, {"grpc": "gamma"}, channels=("grpc",),
         raw={"gamma": (np.array([1, 2], dtype=np.int64), "INT64")}),
    # Values that do not fit a 32-bit integer or a float32 are refused by name, never wrapped around or made inf.
    Case("max_tokens beyond 32 bits", {"max_tokens": 2**32 + 5}, _e("max_tokens")),
    Case("gamma beyond 32 bits", {"gamma": 2**32 + 2}, _e("gamma")),
    Case("temperature beyond float32", {"temperature": 1e39}, _e("temperature"), channels=("grpc", "http", "openai")),
    Case("top_k beyond 64 bits", {"top_k": 2**64 + 1}, _e("top_k"), channels=("cli", "openai")),
    Case("unknown input", {}, {"grpc": "colour", "http": "colour"}, channels=("grpc", "http"),
         raw={"colour": (np.array([b"red"], dtype=np.object_), "BYTES")}),
    Case("string where a number goes", {"max_tokens": "many"}, {"http": "Unable to parse", "openai": "max_tokens"},
         channels=("http", "openai")),
]
GOOD = "Step 1: 4 + 4 = 8.\n\nStep 2:"


def _request(case: Case) -> dict:
    fields = {"text_input": GOOD, "max_tokens": 12}
    fields.update(case.fields)
    return {k: v for k, v in fields.items() if v is not None}


@pytest.fixture(scope="module")
def reasoner(tiny_profile_yaml):
    profile = load_profile(config=tiny_profile_yaml)
    engines = [PortableEngine.from_pretrained(str(getattr(profile, r).resolved_path()), num_threads=1)
               for r in ("target", "draft", "judge")]
    yield LookaheadReasoner(*engines, defaults=profile.options)
    for e in engines:
        e.close()


def _cli_args(req: dict) -> list[str]:
    flags = {"text_input": "--prompt", "messages": "--messages", "max_tokens": "--max-tokens", "gamma": "--gamma",
             "mode": "--mode", "judge": "--judge", "temperature": "--temperature", "top_p": "--top-p",
             "top_k": "--top-k", "seed": "--seed", "delimiter": "--delimiter", "max_step_tokens": "--max-step-tokens",
             "width": "--width", "sd_method": "--sd-method", "sd_tokens": "--sd-tokens"}
    args = []
    for k, v in req.items():
        if k == "stop":
            for s in v:
                args += ["--stop", s]
        else:
            args += [flags[k], str(v)]
    return args


def _python_call(reasoner, req: dict):
    sampling = {k: req[k] for k in ("temperature", "top_p", "top_k", "seed") if k in req}
    step = {k: v for k, v in (("delimiter", req.get("delimiter")), ("max_step_tokens", req.get("max_step_tokens")))
            if v is not None}
    judge = {"name": req["judge"]} if "judge" in req else None
    opts = with_overrides(
        reasoner.defaults, max_tokens=req.get("max_tokens"), gamma=req.get("gamma"), mode=req.get("mode"),
        width=req.get("width"), stop=tuple(req["stop"]) if "stop" in req else None,
        sampling=reasoner.defaults.sampling.model_dump() | sampling if sampling else None,
        step=reasoner.defaults.step.model_dump() | step if step else None,
        judge=reasoner.defaults.judge.model_dump() | judge if judge else None,
    )
    messages = req.get("messages")
    if messages is not None:
        messages = json.loads(messages)  # a caller of the Python API passes parsed messages
    return reasoner.run(req.get("text_input"), messages, opts)


@pytest.mark.parametrize("case", [c for c in CASES if "python" in c.channels], ids=lambda c: c.name)
def test_python_api(reasoner, case):
    with pytest.raises(ValueError, match=case.expect["python"]):
        _python_call(reasoner, _request(case))
    assert reasoner.run(GOOD, options=with_overrides(reasoner.defaults, max_tokens=6)).metrics.generated_tokens == 6


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if "cli" in c.channels], ids=lambda c: c.name)
def test_cli(tiny_profile_yaml, case):
    out = subprocess.run([sys.executable, "-m", "lookahead_reasoning.cli", "generate", "--config",
                          str(tiny_profile_yaml), *_cli_args(_request(case))], capture_output=True, text=True,
                         timeout=300, errors="surrogateescape")
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and case.expect["cli"] in lines[0], out.stderr


async def _stream_error(server, model: str, arrays: dict, types: dict) -> str | None:
    """Send one decoupled gRPC request to ``model``: its error message, or None once its final response came."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = []
    for name, arr in arrays.items():
        t = grpcclient.InferInput(name, list(arr.shape), types[name])
        t.set_data_from_numpy(arr)
        inputs.append(t)

    async def it():
        yield {"model_name": model, "inputs": inputs}

    try:
        async for result, error in client.stream_infer(it()):
            if error is not None:
                return str(error)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        return None
    finally:
        await client.close()


async def _grpc(server, case: Case):
    from lookahead_reasoning.serving.client import _TYPES, _inputs

    req = _request(case)
    prompt, messages = req.pop("text_input", None), req.pop("messages", None)
    if "text_input" in case.raw:
        prompt = GOOD  # replaced by the raw tensor below
    arrays = _inputs(prompt, messages, True, req)
    types = {k: _TYPES[k][0] for k in arrays}
    for name, (arr, dtype) in case.raw.items():
        arrays[name], types[name] = arr, dtype
    return await _stream_error(server, "lookahead_reasoning", arrays, types)


@pytest.mark.parametrize("case", [c for c in CASES if "grpc" in c.channels], ids=lambda c: c.name)
def test_grpc(tiny_server, case):
    err = asyncio.run(_grpc(tiny_server, case))
    assert err is not None and case.expect["grpc"] in err, err
    good = asyncio.run(TritonLRClient(tiny_server.grpc_url, "grpc").generate(GOOD, max_tokens=6))
    assert good.metrics["generated_tokens"] == 6


@pytest.mark.parametrize("case", [c for c in CASES if "http" in c.channels], ids=lambda c: c.name)
def test_http(tiny_server, case):
    body = _request(case)
    for name, (arr, _) in case.raw.items():
        body[name] = [x.decode() if isinstance(x, bytes) else x.item() for x in arr.reshape(-1)][0]
    r = httpx.post(f"http://{tiny_server.http_url}/v2/models/lookahead_reasoning/generate", json=body, timeout=60)
    # our refusals are 400; a JSON value of the wrong type never reaches our model: Triton 2.51's own parser
    # answers 500 "Unable to parse 'data': ..." (README, "Triton deployment")
    assert r.status_code == (500 if case.expect["http"] == "Unable to parse" else 400), r.text
    assert case.expect["http"] in r.json()["error"], r.text
    good = asyncio.run(TritonLRClient(tiny_server.http_url, "http").generate(GOOD, max_tokens=6))
    assert good.metrics["generated_tokens"] == 6


def _openai_body(case: Case) -> tuple[str, dict]:
    """The case as an OpenAI request: the endpoint and a body with the OpenAI names of the fields."""
    from lookahead_reasoning.core.request import BY_NAME, canonical

    body = {}
    for k, v in _request(case).items():
        name = canonical(k, "triton")
        body[BY_NAME[name].openai if name in BY_NAME else k] = v
    if "messages" in body:
        try:
            body["messages"] = json.loads(body["messages"])
        except json.JSONDecodeError:
            pass  # sent as the string it is
        return "chat/completions", body
    return "completions", body


@pytest.mark.parametrize("case", [c for c in CASES if "openai" in c.channels], ids=lambda c: c.name)
def test_openai(tiny_openai, case):
    endpoint, body = _openai_body(case)
    r = httpx.post(f"http://{tiny_openai}/v1/{endpoint}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith(case.expect["openai"]), err
    good = httpx.post(f"http://{tiny_openai}/v1/completions", json={"prompt": GOOD, "max_tokens": 6}, timeout=60)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 6



# Raw HTTP generate bodies (issue 22's list). Triton 2.51 parses the JSON and converts each field to its declared
# tensor type before our model runs: those answer 500 with Triton's own parser message (README, "Triton
# deployment"); values that parse reach our model and get 400 naming the field.
RAW_HTTP = [
    ("non-JSON body", b"this is not json", 500, "failed to parse the request JSON buffer"),
    ("empty body", b"", 500, "The document is empty"),
    ("JSON array", b"[1, 2]", 500, "attempt to get members for non-object"),
    ("text_input an int", b'{"text_input": 5}', 500, "Unable to parse JSON bytes array"),
    ("text_input an object", b'{"text_input": {"a": 1}}', 500, "Unable to parse JSON bytes array"),
    ("lone surrogate", b'{"text_input": "\\ud800"}', 500, "surrogate pair in string is invalid"),
    ("stream a string", b'{"text_input": "hi", "stream": "yes"}', 500, "non-boolean as boolean"),
    ("stream an int", b'{"text_input": "hi", "stream": 1}', 500, "non-boolean as boolean"),
    ("max_tokens null", b'{"text_input": "hi", "max_tokens": null}', 500, "non-signed-integer as signed-integer"),
    ("max_tokens true", b'{"text_input": "hi", "max_tokens": true}', 500, "non-signed-integer as signed-integer"),
    ("temperature a word", b'{"text_input": "hi", "temperature": "hot"}', 500, "non-number as double"),
    ("seed beyond int64", b'{"text_input": "hi", "seed": 18446744073709551617}', 500, "non-signed-integer"),
    ("max_tokens 10^12", b'{"text_input": "hi", "max_tokens": 1000000000000}', 400,
     "max_tokens: 1000000000000 exceeds"),
    ("top_k 2^32+1", b'{"text_input": "hi", "top_k": 4294967297}', 400, "top_k: 4294967297 exceeds"),
]


@pytest.mark.parametrize("name, body, status, message", RAW_HTTP, ids=[r[0] for r in RAW_HTTP])
def test_http_raw_bodies(tiny_server, name, body, status, message):
    r = httpx.post(f"http://{tiny_server.http_url}/v2/models/lookahead_reasoning/generate", content=body,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status and message in r.json()["error"], r.text
    good = asyncio.run(TritonLRClient(tiny_server.http_url, "http").generate(GOOD, max_tokens=6))
    assert good.metrics["generated_tokens"] == 6

def test_no_internal_error_and_healthy_after_the_catalogue(tiny_server):
    """After every malformed request above (this test runs after them in file order) and two of its own: none
    ended as an internal error of our model (a 500 from our code), the refusals were counted as bad requests,
    and the server reports itself ready."""
    from conftest import scrape

    for body in ({"text_input": GOOD, "max_tokens": 0}, {"text_input": GOOD, "gamma": -1}):
        r = httpx.post(f"http://{tiny_server.http_url}/v2/models/lookahead_reasoning/generate", json=body, timeout=60)
        assert r.status_code == 400, r.text
    samples = scrape(tiny_server)
    assert sum(v for k, v in samples.items() if k.startswith("lookahead_request_errors_total")
               and 'reason="internal"' in k) == 0
    assert sum(v for k, v in samples.items() if k.startswith("lookahead_request_errors_total")
               and 'reason="bad_request"' in k) >= 2
    assert httpx.get(f"http://{tiny_server.http_url}/v2/health/ready", timeout=10).status_code == 200

def test_catalogue_size():
    """At least 60 malformed requests over the server's fronts (HTTP generate, gRPC, the OpenAI front)."""
    assert len(CASES) >= 25
    for channel in ALL:
        assert sum(channel in c.channels for c in CASES) >= 18, channel
    assert sum(ch in c.channels for c in CASES for ch in ("grpc", "http", "openai")) >= 60


def test_a_judge_the_server_does_not_serve_is_refused(tiny_server):
    """The embedding judge's model is not loaded by a profile that does not list it: a request for it is refused
    by name (it never makes the server load MiniLM for everybody), and the server keeps serving."""
    client = TritonLRClient(tiny_server.grpc_url, "grpc")
    with pytest.raises(Exception, match="judge: 'embedding' is not served"):
        asyncio.run(client.generate(GOOD, max_tokens=8, judge="embedding"))
    assert asyncio.run(client.generate(GOOD, max_tokens=6)).metrics["generated_tokens"] == 6


def test_role_models_are_internal(tiny_server):
    """A well-formed call to the target model from outside (gRPC; role models are decoupled, so HTTP cannot call
    them at all) is refused naming the model, while the orchestrator's own calls to it, which carry the server's
    secret, keep working."""
    from lookahead_reasoning.backends.base import GenerationRequest
    from lookahead_reasoning.backends.role_tensors import requests_to_arrays
    from tritonclient.utils import np_to_triton_dtype

    arrays = requests_to_arrays([GenerationRequest((5, 6, 7), 4)])
    got = asyncio.run(_stream_error(tiny_server, "target", arrays,
                                    {k: np_to_triton_dtype(a.dtype) for k, a in arrays.items()}))
    assert got is not None and "target: internal model" in got, got
    assert asyncio.run(TritonLRClient(tiny_server.grpc_url, "grpc").generate(GOOD, max_tokens=6)).metrics[
        "generated_tokens"] == 6



def test_open_role_models_still_enforce_their_limits(tmp_path_factory, tiny_profile_yaml):
    """With ``--open-role-models`` anyone may call ``target``, but within the role model's own caps: the issue-22
    example (64 sequences x 200 tokens in one call) is refused naming ``rows``; a small call is served."""
    from conftest import start_server
    from lookahead_reasoning.backends.base import GenerationRequest
    from lookahead_reasoning.backends.role_tensors import requests_to_arrays
    from tritonclient.utils import np_to_triton_dtype

    def call(reqs):
        arrays = requests_to_arrays(reqs)
        return asyncio.run(_stream_error(server, "target", arrays,
                                         {k: np_to_triton_dtype(a.dtype) for k, a in arrays.items()}))

    server = start_server(tmp_path_factory, tiny_profile_yaml, open_role_models=True)
    try:
        err = call([GenerationRequest((5, 6, 7), 200)] * 64)
        assert err is not None and "rows: 64 sequences" in err, err
        err = call([GenerationRequest((5, 6, 7), 600)])
        assert err is not None and "max_new_tokens: 600" in err, err  # the server's max_tokens_limit is 512
        assert call([GenerationRequest((5, 6, 7), 4)]) is None  # open: an outside call within the caps is served
    finally:
        server.stop()
