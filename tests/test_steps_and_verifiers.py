"""Steps, reasoning split, verifiers, the speed model and the adaptive gamma rule."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead_reasoning.lookahead import AdaptiveGamma, LROptions
from lookahead_reasoning.metrics import estimate_speedup, expected_steps_per_cycle
from lookahead_reasoning.steps import Step, StepConfig, split_reasoning, split_steps
from lookahead_reasoning.verifiers import (NumericVerifier, RandomVerifier, VerifierConfig, make_verifier, normalize,
                                           numbers)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab \n.#1", max_size=60), st.sampled_from(["\n\n", "\n", ".", "ab"]))
def test_split_steps_joins_back(text, delim):
    steps = split_steps(text, delim)
    assert "".join(steps) == text
    assert all(s.endswith(delim) for s in steps[:-1])
    assert all(delim not in s[: len(s) - len(delim)] for s in steps)


def test_split_steps_rejects_empty_delimiter():
    with pytest.raises(ValueError, match="delimiter"):
        split_steps("a", "")
    with pytest.raises(ValueError, match="delimiter"):
        StepConfig(delimiter="")


@pytest.mark.parametrize("text, reasoning, answer", [
    ("<think>a\n\nb</think>\n\nThe answer is 4.", "a\n\nb", "The answer is 4."),
    ("a then b</think>final", "a then b", "final"),
    ("<think>still thinking", "still thinking", ""),
    ("no tags at all", None, "no tags at all"),
])
def test_split_reasoning(text, reasoning, answer):
    assert split_reasoning(text) == (reasoning, answer)


def _step(text, ids=None):
    ids = ids if ids is not None else [ord(c) for c in text]
    return Step(text, ids, ids, "stop", "target")


def _verify(v, pairs):
    return asyncio.run(v.verify([(_step(a), _step(b)) for a, b in pairs]))


def test_exact_and_normalized():
    exact = make_verifier(VerifierConfig(name="exact"))
    norm = make_verifier(VerifierConfig(name="normalized"))
    pairs = [("He has 4 x 12 = 48 pencils.", "He has 4 x 12 = 48 pencils."),
             ("He has 4 x 12 = 48 pencils.", "he has 4x12=48 Pencils."),
             ("He has 4 x 12 = 48 pencils.", "He has 12 x 4 = 48 pencils.")]
    assert [v.accept for v in _verify(exact, pairs)] == [True, False, False]
    assert [v.accept for v in _verify(norm, pairs)] == [True, True, False]
    assert normalize(" A b\n\nC ") == "abc"


def test_numeric_same_numbers_and_result():
    v = NumericVerifier()
    got = _verify(v, [
        ("Mia buys 4 x 12 = 48 pencils.", "The boxes hold 12 x 4 = 48 pencils in total."),
        ("Mia buys 4 x 12 = 48 pencils.", "Mia buys 4 x 12 = 46 pencils."),
        ("So the total is 1,000 dollars.", "Total: 1000"),
        ("No numbers here.", "no numbers HERE."),
        ("No numbers here.", "Something else."),
    ])
    assert [x.accept for x in got] == [True, False, True, True, False]
    assert numbers("-3.5 and 1,200 and x2") == [-3.5, 1200.0]


def test_random_verifier_is_seeded():
    a = _verify(RandomVerifier(0.5, seed=3), [("a", "b")] * 20)
    b = _verify(RandomVerifier(0.5, seed=3), [("a", "b")] * 20)
    assert [x.accept for x in a] == [x.accept for x in b]
    assert 0 < sum(x.accept for x in a) < 20


def test_llm_verifier_needs_a_judge():
    with pytest.raises(ValueError, match="judge"):
        make_verifier(VerifierConfig(name="llm"), None)


def test_expected_steps_and_speedup():
    assert expected_steps_per_cycle(0.0, 4) == 1.0
    assert expected_steps_per_cycle(1.0, 4) == 5.0
    assert expected_steps_per_cycle(0.5, 2) == pytest.approx(1.75)
    # (1 + .8 + .64) / (2 * 0.2 + 1.3) = 2.44 / 1.7
    assert estimate_speedup(0.8, 2, 0.2, 1.3) == pytest.approx(2.44 / 1.7)
    assert estimate_speedup(0.0, 0, 0.2, 1.0) == 1.0
    with pytest.raises(ValueError, match="alpha"):
        expected_steps_per_cycle(1.5, 2)


def test_adaptive_gamma_rule():
    ctl = AdaptiveGamma(start=2, max_gamma=4, load_threshold=8, probe_every=3)
    assert ctl.next_gamma(load=0) == 2
    ctl.update(drafted=2, accepted=2)
    assert ctl.next_gamma(0) == 3
    ctl.update(3, 0)
    ctl.update(2, 0)
    ctl.update(1, 0)
    assert ctl.gamma == 0
    seq = [ctl.next_gamma(0) for _ in range(6)]
    assert seq == [0, 0, 1, 0, 0, 1]  # a probe cycle every 3rd cycle at gamma 0
    ctl.update(1, 1)  # the probe's draft was accepted: recover
    assert ctl.gamma == 1
    busy = AdaptiveGamma(start=4, max_gamma=4, load_threshold=8)
    assert busy.next_gamma(load=16) == 2  # 16 sequences in flight: cap = 4 - 16 // 8


@pytest.mark.parametrize("kwargs, field", [
    ({"gamma": -1}, "gamma"), ({"gamma": 9}, "gamma"), ({"mode": "fast"}, "mode"), ({"width": 0}, "width"),
    ({"max_tokens": 0}, "max_tokens"), ({"stop": ("",)}, "stop"), ({"judge": {"name": "oracle"}}, "name"),
])
def test_options_reject_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LROptions(**kwargs)
