"""Property-based tests (hypothesis): configuration parsing and stop-string matching across token boundaries.
(Step splitting's property, joining the steps gives back the text, is in test_steps_and_verifiers.py.)"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lookahead_reasoning.backends.base import GenerationRequest, SamplingParams, SpecDecodeConfig
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.backends.role_tensors import arrays_to_requests, requests_to_arrays
from lookahead_reasoning.core.lookahead import LROptions
from lookahead_reasoning.profiles import Profile
from pydantic import ValidationError

values = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**7), st.floats(allow_nan=True),
                   st.text(max_size=8), st.lists(st.text(max_size=3), max_size=3))
keys = st.sampled_from(["mode", "gamma", "max_gamma", "width", "async", "adaptive_gamma", "max_tokens", "stop",
                        "draft_temperature", "judge_timeout_s", "unknown_field"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values, max_size=5))
def test_options_parse_or_fail_cleanly(data):
    try:
        opts = LROptions.model_validate(data)
    except ValidationError as exc:
        assert isinstance(exc, ValueError) and exc.errors()  # names at least one field
        return
    again = LROptions.model_validate(opts.model_dump(by_alias=True))
    assert again == opts
    assert 0 <= opts.gamma <= opts.max_gamma and opts.width >= 1 and opts.token_budget >= 1


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["name", "target", "draft", "judge", "options", "max_gamma_cap"]),
                       st.one_of(values, st.fixed_dictionaries({"path": st.text(max_size=5)})), max_size=4))
def test_profile_parse_or_fail_cleanly(data):
    try:
        Profile.model_validate(data)
    except ValidationError as exc:
        assert exc.errors()


@pytest.fixture(scope="module")
def engine_and_text(tiny_model_dir):
    eng = PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1)
    prompt = eng.encode("Step 1: 4 + 4 = 8.\n\nThe total")
    free = eng.generate([GenerationRequest(prompt, 40)])[0]
    yield eng, prompt, free
    eng.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_stop_string_ends_with_the_completing_token(engine_and_text, data):
    eng, prompt, free = engine_and_text
    text = free.text
    start = data.draw(st.integers(0, len(text) - 1), label="start")
    stop = text[start:start + data.draw(st.integers(1, 5), label="length")]
    assume(stop.strip("\ufffd"))
    # Expected: the shortest prefix of the free continuation whose decoded text contains the stop string.
    k = next((k for k in range(1, len(free.token_ids) + 1) if stop in eng.decode(free.token_ids[:k])), None)
    assume(k is not None)
    res = eng.generate([GenerationRequest(prompt, 40, stop=(stop,))])[0]
    assert res.finish_reason == "stop"
    assert res.token_ids == free.token_ids[:k]
    assert stop in res.text and stop not in eng.decode(res.token_ids[:-1])


_sampling = st.one_of(
    st.just(SamplingParams()),
    st.builds(SamplingParams, temperature=st.floats(0.0, 2.0, width=32), top_p=st.floats(0.0625, 1.0, width=32),
              top_k=st.integers(0, 50), seed=st.one_of(st.none(), st.integers(0, 2**62))),
)
_spec = st.one_of(st.just(SpecDecodeConfig()), st.just(SpecDecodeConfig(method="ngram", num_speculative_tokens=6)))


@given(prompts=st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=12), min_size=1, max_size=4),
       sampling=st.lists(_sampling, min_size=4, max_size=4), spec=_spec,
       stop=st.lists(st.text(min_size=1, max_size=4), max_size=2), max_new=st.integers(1, 100),
       predictions=st.lists(st.lists(st.integers(0, 1000), max_size=6), min_size=4, max_size=4))
def test_role_model_tensors_round_trip(prompts, sampling, spec, stop, max_new, predictions):
    """What the BLS caller sends (defaults omitted) decodes to the same engine requests in the role model."""
    reqs = [GenerationRequest(tuple(p), max_new, tuple(stop), sampling[i], spec, prediction=predictions[i])
            for i, p in enumerate(prompts)]
    arrays = requests_to_arrays(reqs)
    back = arrays_to_requests(arrays.get)
    assert [(tuple(r.prompt_ids), r.max_new_tokens, r.stop, r.sampling, r.spec, r.prediction) for r in back] == \
        [(tuple(r.prompt_ids), r.max_new_tokens, r.stop, r.sampling, r.spec, r.prediction) for r in reqs]
    if all(s == SamplingParams() for s in sampling[: len(prompts)]) and spec == SpecDecodeConfig() \
            and not any(predictions[: len(prompts)]):
        assert set(arrays) <= {"input_ids", "input_lengths", "max_tokens", "stop"}  # greedy calls stay small


def _kv_of(tokens):
    """A fake KV ``[layers=1, 2, heads=1, n, dim=2]`` that encodes (token, position), to check what comes back."""
    import torch

    t = torch.tensor([[float(x), float(i)] for i, x in enumerate(tokens)]).reshape(1, 1, 1, len(tokens), 2)
    return torch.cat([t, -t], dim=1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=4),
       st.lists(st.integers(0, 3), min_size=1, max_size=45), st.integers(1, 8))
def test_prefix_cache_matches_the_longest_common_prefix(stored, query, block_size):
    """With no eviction, a lookup returns the longest common prefix of the query with any stored sequence (whole
    blocks, then token by token into the next block or a partial tail), and exactly that prefix's KV."""
    import os

    from lookahead_reasoning.backends.kv_cache import PrefixCache

    cache = PrefixCache(block_size, max_bytes=1 << 30)
    for seq in stored:
        cache.insert(tuple(seq), _kv_of(seq))
    n, kv = cache.match(tuple(query), len(query))
    assert n == max(len(os.path.commonprefix([seq, query])) for seq in stored)
    assert (kv is None) == (n == 0)
    if n:
        assert kv.equal(_kv_of(query[:n]))


def test_role_call_limits():
    """A role model refuses, naming the field, a call with more rows or more new tokens than its caps (the
    issue-22 example: 64 sequences x 200 tokens sent straight to ``target``); the orchestrator's calls fit."""
    from lookahead_reasoning.backends.base import GenerationRequest
    from lookahead_reasoning.backends.role_tensors import ROLE_MAX_ROWS, check_role_call

    check_role_call([GenerationRequest((1, 2), 100)] * ROLE_MAX_ROWS, max_new_tokens=512)
    with pytest.raises(ValueError, match=r"^rows: 64 sequences .* limit of 33"):
        check_role_call([GenerationRequest((1, 2), 200)] * 64)
    with pytest.raises(ValueError, match=r"^max_new_tokens: 600 exceeds .* limit of 512"):
        check_role_call([GenerationRequest((1, 2), 600)], max_new_tokens=512)
