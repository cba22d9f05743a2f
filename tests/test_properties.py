"""Property-based tests (hypothesis): configuration parsing and stop-string matching across token boundaries.
(Step splitting's property, joining the steps gives back the text, is in test_steps_and_verifiers.py.)"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lookahead_reasoning.backends.base import GenerationRequest
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.lookahead import LROptions
from lookahead_reasoning.profiles import Profile

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
    assert 0 <= opts.gamma <= opts.max_gamma and opts.width >= 1 and opts.max_tokens >= 1


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
