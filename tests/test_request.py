"""One request definition (lookahead_reasoning.core.request): the committed config.pbtxt, the client's tensor types,
the CLI flags and the OpenAI body agree with it, and errors name the field in each front's terms."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lookahead_reasoning.core.errors import FieldError
from lookahead_reasoning.core.lookahead import LROptions, check_input
from lookahead_reasoning.core.request import (
    BY_NAME,
    FIELDS,
    TRITON_INPUTS,
    RequestError,
    canonical,
    parse_request,
    rename,
    translate,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "triton_models" / "lookahead_reasoning" / "config.pbtxt"


def _blocks(text: str, kind: str) -> list[tuple[str, str, str]]:
    section = re.search(rf"^{kind} \[(.*?)^\]", text, re.S | re.M).group(1)
    return re.findall(r'name: "(\w+)"\s+data_type: (\w+)\s+dims: (\[[^\]]*\])', section)


def test_committed_config_is_derived_from_the_request():
    from lookahead_reasoning.serving.model_repository import render_config

    text = CONFIG.read_text()
    inputs = _blocks(text, "input")
    assert [name for name, _, _ in inputs] == list(TRITON_INPUTS)
    for (name, dtype, dims), f in zip(inputs, FIELDS, strict=False):
        assert (name, dtype, dims) == (f.triton, "TYPE_" + f.dtype, "[ -1 ]" if f.many else "[ 1 ]")
    assert [n for n, _, _ in _blocks(text, "output")] == ["text_output", "metrics"]
    params = dict(re.findall(r'key: "(\w+)"\s+value: \{ string_value: "([^"]*)" \}', text))
    assert render_config("lookahead_reasoning", params) == text  # the whole file is the module's output


@pytest.mark.parametrize("role", ["draft", "target", "judge"])
def test_committed_role_configs_are_derived_from_the_role_tensor_table(role):
    """The role models' config.pbtxt, the codec's dtypes and the BLS caller's outputs: one table (role_tensors)."""
    from lookahead_reasoning.backends.base import GenerationRequest, GenerationResult, SamplingParams, SpecDecodeConfig
    from lookahead_reasoning.backends.role_tensors import (
        ROLE_INPUTS,
        ROLE_OUTPUTS,
        requests_to_arrays,
        results_to_arrays,
    )
    from lookahead_reasoning.backends.triton_bls import OUTPUTS
    from lookahead_reasoning.serving.model_repository import render_config

    text = (REPO / "triton_models" / role / "config.pbtxt").read_text()
    for kind, table in (("input", ROLE_INPUTS), ("output", ROLE_OUTPUTS)):
        assert _blocks(text, kind) == [(t.name, "TYPE_" + t.dtype, "[ " + ", ".join(map(str, t.dims)) + " ]")
                                       for t in table]
    params = dict(re.findall(r'key: "(\w+)"\s+value: \{ string_value: "([^"]*)" \}', text))
    assert render_config(role, params) == text  # the whole file is the module's output
    assert OUTPUTS == [t.name for t in ROLE_OUTPUTS]
    sampled = SamplingParams(temperature=0.5, seed=3)
    spec = SpecDecodeConfig(method="ngram", num_speculative_tokens=2)
    every = requests_to_arrays([GenerationRequest((1, 2), 4, ("x",), sampled, spec, stop_count=2,
                                                  max_tokens_per_stop=3, prediction=(5, 6))])
    assert set(every) == {t.name for t in ROLE_INPUTS} - {"text_input"}  # every input (text_input: ids instead)
    out = results_to_arrays([GenerationResult([7], "a", "stop")])
    for arrays, table in ((every, ROLE_INPUTS), (out, ROLE_OUTPUTS)):
        specs = {t.name: t for t in table}
        for name, arr in arrays.items():
            assert arr.dtype == specs[name].numpy_dtype and arr.ndim == len(specs[name].dims), name


def test_client_types_are_derived_from_the_request():
    from lookahead_reasoning.serving.client import _TYPES

    assert list(_TYPES) == list(TRITON_INPUTS)
    wire = {"STRING": "BYTES", "INT32": "INT32", "INT64": "INT64", "FP32": "FP32", "BOOL": "BOOL"}
    for f in FIELDS:
        assert _TYPES[f.triton][0] == wire[f.dtype], f.name


@pytest.mark.parametrize("command", ["generate", "client"])
def test_cli_flags_are_derived_from_the_request(command):
    from lookahead_reasoning.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    by_flag = {s: a for a in sub._actions for s in a.option_strings}
    for f in FIELDS:
        if f.cli is None or (command == "client" and f.name == "messages"):
            continue
        action = by_flag[f.cli]
        assert action.dest == f.name or (command == "client" and f.name == "prompt"), f.name
        if f.dtype in ("INT32", "INT64"):
            assert action.type is int
        elif f.dtype == "FP32":
            assert action.type is float
        elif f.dtype == "BOOL":
            assert action.nargs == 0  # store_true


def test_openai_body_is_derived_from_the_request():
    from lookahead_reasoning.serving.openai_front import ChatRequest

    body = ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                       **{f.openai: None for f in FIELDS if f.openai not in ("prompt", "messages")}})
    fields = set(type(body).model_fields)
    assert {f.name for f in FIELDS if f.openai and f.name not in ("prompt", "messages")} <= fields
    params = ChatRequest.model_validate({"messages": [], "async": True, "gamma": 2, "top_k": 5}).params()
    assert params == {"async": True, "gamma": 2, "top_k": 5}  # Triton names, ready for the server


@pytest.mark.parametrize("values, field, cli, triton, openai", [
    ({"prompt": " "}, "prompt", "--prompt", "text_input", "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "--max-tokens", "max_tokens", "max_tokens"),
    ({"prompt": "x", "gamma": -1}, "gamma", "--gamma", "gamma", "gamma"),
    ({"prompt": "x", "gamma": 9}, "gamma", "--gamma", "gamma", "gamma"),  # over the cap (LROptions.max_gamma, 8)
    ({"prompt": "x", "top_p": 1.5}, "top_p", "--top-p", "top_p", "top_p"),
    ({"prompt": "x", "judge": "oracle"}, "judge", "--judge", "judge", "judge"),
    ({"prompt": "x", "async_mode": "yes"}, "async_mode", "--async", "async", "async"),
    ({"prompt": "x", "delimiter": ""}, "delimiter", "--delimiter", "delimiter", "delimiter"),
    ({"prompt": "x", "stop": ["a", ""]}, "stop", "--stop", "stop", "stop"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
     "messages[1].role", "--messages[1].role", "messages[1].role", "messages[1].role"),
    ({"messages": "[{"}, "messages", "--messages", "messages", "messages"),
    ({"prompt": "x", "colour": "red"}, "colour", "colour", "colour", "colour"),
])
def test_errors_name_the_field_in_each_front(values, field, cli, triton, openai):
    with pytest.raises(RequestError) as info:
        parse_request(values, LROptions())
    err = info.value
    assert err.field == field
    for front, name in (("cli", cli), ("triton", triton), ("openai", openai), ("python", field)):
        assert err.for_front(front).startswith(name + ":"), (front, err.for_front(front))


def test_one_conversion_to_options():
    req, opts = parse_request({"prompt": "hi", "gamma": 2, "temperature": 0.5, "top_k": 3, "judge": "numeric",
                               "delimiter": "\n", "async_mode": True, "stop": "END"}, LROptions())
    assert (opts.gamma, opts.sampling.temperature, opts.sampling.top_k, opts.judge.name) == (2, 0.5, 3, "numeric")
    assert opts.step.delimiter == "\n" and opts.async_mode and opts.stop == ("END",)
    assert req.prompt == "hi" and req.chat() is None
    _, defaults = parse_request({}, LROptions(gamma=3), require_input=False)
    assert defaults == LROptions(gamma=3)  # nothing given: the profile's options unchanged


def test_names_round_trip_and_translate():
    for f in FIELDS:
        for front in ("cli", "triton", "openai", "python"):
            assert canonical(rename(f.name, front), front) == f.name
    assert translate("text_input: 90000 bytes exceeds the server limit", "triton", "openai").startswith("prompt:")
    assert translate("async: bad", "triton", "cli").startswith("--async:")
    assert translate("server busy: 4 requests in flight", "triton", "openai") == "server busy: 4 requests in flight"
    assert BY_NAME["prompt"].triton == "text_input"


def test_check_input_is_the_python_front():
    """The Python API's one input check (LookaheadReasoner.stream), which parse_request uses too."""
    check_input("hi", None)
    for prompt, messages, field in ((None, None, "prompt"), ("a", [{"role": "user", "content": "b"}], "prompt"),
                                    (None, [], "messages"), (None, [{"role": "user", "content": " "}], "messages"),
                                    (None, [{"role": "user"}], "messages[0].content")):
        with pytest.raises(FieldError) as info:
            check_input(prompt, messages)
        assert info.value.field == field


def test_developer_role_reads_as_system():
    """OpenAI's ``developer`` role (its newer name for instructions) is read as ``system``, as vLLM does; another
    role is refused naming the four accepted ones."""
    req, _ = parse_request({"messages": [{"role": "developer", "content": "be brief"},
                                         {"role": "user", "content": "2 + 2?"}]}, LROptions())
    assert [m["role"] for m in req.chat()] == ["system", "user"]
    with pytest.raises(RequestError, match=r"messages\[0\]\.role: must be .*'developer', got 'robot'"):
        parse_request({"messages": [{"role": "robot", "content": "x"}]}, LROptions())


def test_one_gamma_cap_is_the_options_max_gamma(tmp_path):
    """Issue 57: ``LROptions.max_gamma`` (a profile's ``options.max_gamma``) is the one cap on gamma; a request
    over it is refused naming ``gamma`` and stating the cap. The old top-level ``max_gamma_cap`` still loads."""
    import yaml
    from lookahead_reasoning.profiles import Profile, load_profile

    target = {"path": "demo/target"}
    profile = Profile.model_validate({"name": "t", "target": target, "options": {"max_gamma": 6}})
    assert parse_request({"prompt": "x", "gamma": 6}, profile.options)[1].gamma == 6
    with pytest.raises(RequestError) as info:
        parse_request({"prompt": "x", "gamma": 7}, profile.options)
    assert info.value.field == "gamma" and "6" in info.value.message
    assert info.value.for_front("cli").startswith("--gamma:")

    old = Profile.model_validate({"name": "t", "target": target, "options": {"gamma": 2}, "max_gamma_cap": 5})
    assert (old.options.max_gamma, old.options.gamma) == (5, 2) and "max_gamma_cap" not in Profile.model_fields
    same = Profile.model_validate({"name": "t", "target": target, "options": {"max_gamma": 5}, "max_gamma_cap": 5})
    assert same.options.max_gamma == 5
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "target": target, "options": {"gamma": 2}, "max_gamma_cap": 3}))
    assert load_profile(config=path).options.max_gamma == 3
    path.write_text(yaml.safe_dump({"name": "t", "target": target, "options": {"max_gamma": 4}, "max_gamma_cap": 3}))
    with pytest.raises(ValueError, match=r": max_gamma_cap: 3 differs from options.max_gamma 4"):
        load_profile(config=path)
