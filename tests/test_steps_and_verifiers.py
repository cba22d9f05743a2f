"""Steps, reasoning split, verifiers, the speed model and the adaptive gamma rule."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead_reasoning.core.calibration import CostModel
from lookahead_reasoning.core.lookahead import AdaptiveGamma, LROptions
from lookahead_reasoning.core.metrics import RequestMetrics, RoleCounters, iid_steps_per_cycle
from lookahead_reasoning.core.steps import Step, StepConfig, split_reasoning, split_steps
from lookahead_reasoning.core.verifiers import (
    NumericVerifier,
    RandomVerifier,
    VerifierConfig,
    equations,
    make_verifier,
    normalize,
    numbers,
    same_arithmetic,
)


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


@pytest.mark.parametrize("text, parser, reasoning, answer", [
    ("<think>a\n\nb</think>\n\nThe answer is 4.", "qwen3", "a\n\nb", "The answer is 4."),
    ("<think>a\n\nb</think>\n\nThe answer is 4.", "deepseek_r1", "a\n\nb", "The answer is 4."),
    ("a then b</think>final", "deepseek_r1", "a then b", "final"),
    ("a then b</think>final", "qwen3", None, "a then b</think>final"),
    ("<think>still thinking", "qwen3", "still thinking", ""),
    ("no tags at all", "qwen3", None, "no tags at all"),
])
def test_split_reasoning(text, parser, reasoning, answer):
    assert split_reasoning(text, parser) == (reasoning, answer)


def test_split_reasoning_parsers():
    # deepseek_r1: the chat template opened <think>, so untagged text is reasoning still in progress
    assert split_reasoning("step 1\n\nstep 2", "deepseek_r1") == ("step 1\n\nstep 2", "")
    assert split_reasoning("step 1\n\n</think>\n\nAnswer: 4.\n\n#### 4", "deepseek_r1") == (
        "step 1", "Answer: 4.\n\n#### 4")
    assert split_reasoning("no tags", "qwen3") == (None, "no tags")
    assert split_reasoning("a</think>b", "none") == (None, "a</think>b")


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.sampled_from(["<think>", "</think>", "\n\n", "step 1.", " 4 + 5 = 9.", "<", "</th", "ink>",
                                                    "#### 9", " ", "\n", "x = "]),
                      max_size=12),
       cuts=st.lists(st.integers(0, 200), max_size=6),
       parser=st.sampled_from(["qwen3", "deepseek_r1", "none"]))
def test_reasoning_stream_matches_split(parts, cuts, parser):
    """Streamed in any chunking, the reasoning and answer deltas add up to exactly what split_reasoning gives."""
    from lookahead_reasoning.core.steps import ReasoningStream

    text = "".join(parts)
    bounds = sorted({0, len(text), *[c % (len(text) + 1) for c in cuts]})
    stream, r, a = ReasoningStream(parser), "", ""
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        dr, da = stream.feed(text[lo:hi])
        r, a = r + dr, a + da
    dr, da = stream.flush()
    r, a = r + dr, a + da
    want_r, want_a = split_reasoning(text, parser)
    assert (r, a) == (want_r or "", want_a)  # exactly the non-streamed split, white space included
    if want_r is None:
        assert r == "" and a == text


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


@pytest.mark.parametrize("a,b,same", [
    ("Now 35 + 65 = 100 apples.", "Check: 65 + 35 = 100, which matches.", True),  # + commutes
    ("That is 6 x 4 = 24.", "4 * 6 = 24 dollars.", True),  # x and * are one operator
    ("So far: 48 dollars.", "That puts it at 48.", True),  # no equation: numbers decide
    ("Now she has 30 - 16 = 14 apples.", "Now she has 16 - 30 = 14 apples.", False),  # - does not commute
    ("So it is 272 / 2 = 136.", "So it is 2 / 272 = 136.", False),
    ("That makes 68 + 43 = 111.", "That makes 18 + 43 = 61.", False),
    ("That makes 1 x 2 = 2.", "That makes 1 / 2 = 2.", False),  # same numbers, other operator
    ("Checking it, 48 + 452 = 500 is right.", "To verify: 52 + 448 = 500.", False),
    ("He gives 22 books away.", "He gives 23 books away.", False),
    ("3x4=12 pens.", "3 x 4 = 12 pens.", True),  # spacing
    ("Now 30 -16 = 14.", "Now 30 - 16 = 14.", True),  # "-16" after a number is a minus, not a negative
    ("30 \u2212 16 = 14", "30 - 16 = 14", True),  # Unicode minus
    ("3 X 4 = 12", "3 x 4 = 12", True),
    ("14 = 30 - 16, so 14 left.", "30 - 16 = 14 left.", True),  # result first: not read as an equation
    ("2 + 3 + 4 = 9 in all.", "4 + 3 + 2 = 9 in all.", True),  # a chain of + commutes
    ("10 - 2 + 1 = 9", "10 - 1 + 2 = 9", False),  # a mixed chain keeps its order
    ("6 x 6 = 36, so 6 bags of 6.", "6 x 6 = 36", True),  # repeated numbers: a set, not a multiset
    ("5 \u2212 8 = \u22123", "5 - 8 = -3", True),  # Unicode minus as operator and sign
    ("5 - 8 = -3", "8 - 5 = 3", False),
    ("3.5 x 2 = 7 hours", "2 x 3.5 = 7", True),
    ("10 + 5 = 15, then 15 x 2 = 30.", "15 x 2 = 30 after 10 + 5 = 15.", True),  # the same equations, reordered
    ("Then 15 x 2 = 30 (10 + 5 = 15 first).", "10 + 5 = 15 and 15 x 2 = 31", False),
    ("12\n-3 apples", "12 - 3", False),  # a line break is not an operator
])
def test_arithmetic_guard(a, b, same):
    assert same_arithmetic(a, b) is same
    assert same_arithmetic(b, a) is same


def test_arithmetic_guard_is_a_config_field():
    assert VerifierConfig().arithmetic_guard is True
    assert VerifierConfig(arithmetic_guard=False).arithmetic_guard is False
    with pytest.raises(ValueError, match="arithmetic_guard"):
        VerifierConfig(arithmetic_guard="sometimes")
    assert equations("1,000 x 3 = 3,000 and 9-2=7") == [((3.0, 1000.0), ("x",), 3000.0), ((9.0, 2.0), ("-",), 7.0)]


def test_random_verifier_is_seeded_and_has_no_shared_state():
    pairs = [(f"step {i}", f"other {i}") for i in range(40)]
    v = RandomVerifier(0.5, seed=3)
    a = _verify(v, pairs)
    assert [x.accept for x in _verify(v, pairs)] == [x.accept for x in a]  # the same pairs again: same verdicts
    assert [x.accept for x in _verify(RandomVerifier(0.5, seed=3), pairs[::-1])] == [x.accept for x in a][::-1]
    assert 5 < sum(x.accept for x in a) < 35
    assert [x.accept for x in _verify(RandomVerifier(0.5, seed=4), pairs)] != [x.accept for x in a]


def test_llm_verifier_needs_a_judge():
    with pytest.raises(ValueError, match="judge"):
        make_verifier(VerifierConfig(name="llm"), None)


def test_iid_steps_per_cycle():
    assert iid_steps_per_cycle(0.0, 4) == 1.0
    assert iid_steps_per_cycle(1.0, 4) == 5.0
    assert iid_steps_per_cycle(0.5, 2) == pytest.approx(1.75)
    assert iid_steps_per_cycle(0.5, 1.5) == pytest.approx((1.5 + 1.75) / 2)
    with pytest.raises(ValueError, match="alpha"):
        iid_steps_per_cycle(1.5, 2)
    with pytest.raises(ValueError, match="gamma"):
        iid_steps_per_cycle(0.5, -1)


def _two_cycles(sd_method: str = "none", **target) -> RequestMetrics:
    """2 cycles of gamma 2 with 10-token steps: the first accepts both drafts, the second none (``target``: more
    fields of the target's record)."""
    return RequestMetrics(cycles=2, steps=4, target_steps=2, generated_tokens=40, drafted_steps=4, verified_steps=3,
                          accepted_steps=2, accepted_by_depth=[1, 1], verified_by_depth=[2, 1],
                          draft=RoleCounters(forward_passes=40),
                          target=RoleCounters(calls=2, branches=6, call_forwards=20, forward_passes=60,
                                              call_tokens=60, **target),
                          judge_seconds=0.02, sd_method=sd_method)


def test_estimate_from_counts():
    """Equation (1): c = 0.25, b(3) = 1.5, no SD. Per cycle: 20 draft forwards * 0.25 + 10 forwards of the
    longest branch * b(3) at 3 rows per forward + J = 1 forward -> 5 + 15 + 1 = 21 forwards for 2 steps of 10
    tokens."""
    cost = CostModel(target_step_seconds=0.01, draft_step_seconds=0.0025, b={3: 1.5})
    m = _two_cycles()
    assert m.steps_per_cycle == 2.0  # t = 1 plus A_1 = A_2 = 1/2
    assert m.cycle_cost(cost) == pytest.approx({"draft": 5.0, "target": 15.0, "prefill": 0.0, "judge": 1.0})
    assert m.estimate(cost) == pytest.approx(20 / 21)
    # the independence form with alpha = 2/3 and 2 drafted steps per cycle
    assert m.estimate(cost, iid=True) == pytest.approx((1 + 2 / 3 + 4 / 9) * 10 / 21)
    assert m.estimate(cost, free_draft_and_judge=True) == pytest.approx(20 / 15)
    # prefill: 20 new prompt tokens per call cost v(20), extrapolated from v(2) = 1.1, v(8) = 1.7 -> 2.9
    wide = CostModel(0.01, 0.0025, b={3: 1.5}, width={2: 1.1, 8: 1.7})
    p = _two_cycles(prefill_tokens=40, prefill_calls=2)
    assert p.cycle_cost(wide)["prefill"] == pytest.approx(2.9)
    # n-gram SD in the target: 2 positions per forward cost v(2) = 1.1; a draft-model proposer adds c per token
    sd = _two_cycles(proposed_tokens=60, sd_method="draft_model")
    assert sd.cycle_cost(wide)["target"] == pytest.approx(10 * (1.5 * 1.1 + 0.25))
    # the engine's padded widths win over the mean proposals: 3 positions per row -> v(3) = 1.2, 2 proposals
    padded = _two_cycles(proposed_tokens=60, forward_positions=180, sd_method="draft_model")
    assert padded.cycle_cost(wide)["target"] == pytest.approx(10 * (1.5 * 1.2 + 2 * 0.25))
    total = RequestMetrics()
    total.merge(m)
    total.merge(m)
    assert total.cycles == 4 and total.accepted_by_depth == [2, 2] and total.estimate(cost) == pytest.approx(20 / 21)
    assert total.target.calls == 4 and total.draft.forward_passes == 80 and m.target.calls == 2  # records add up
    assert RequestMetrics.from_dict(total.to_dict()) == total  # the JSON form reads back
    assert RequestMetrics().estimate(cost) is None and m.estimate(None) is None


def test_forward_cost_interpolates_and_extrapolates():
    cost = CostModel(0.01, None, width={3: 1.2, 7: 2.0})
    assert cost.forward_cost(1) == cost.forward_cost(0.5) == 1.0
    assert cost.forward_cost(3) == pytest.approx(1.2)
    assert cost.forward_cost(5) == pytest.approx(1.6)
    assert cost.forward_cost(9) == pytest.approx(2.4)
    assert CostModel(0.01, None).forward_cost(40) == 1.0  # nothing measured: a forward costs one decode forward


def test_forward_cost_never_extrapolates_downwards():
    """Noisy points that fall at the end (a busy machine) are held beyond the last one, not extended below zero."""
    noisy = CostModel(0.01, None, width={2: 1.3, 4: 1.1})
    assert noisy.forward_cost(3) == pytest.approx(1.2)
    assert noisy.forward_cost(234) == pytest.approx(1.1)


def test_call_forward_cost_uses_the_joint_rows_by_width_points():
    sep = CostModel(0.01, None, b={3: 1.5}, width={3: 1.2, 7: 2.0})
    assert sep.call_forward_cost(3, 3) == pytest.approx(1.5 * 1.2)  # nothing joint measured: b(r) * v(w)
    joint = CostModel(0.01, None, b={3: 1.5}, width={3: 1.2, 7: 2.0}, row_width={3: {3.0: 2.0}})
    g = 2.0 / (1.5 * 1.2)  # the measured point over b(3) v(3)
    assert joint.call_forward_cost(3, 1) == pytest.approx(1.5)  # one position: b(3)
    assert joint.call_forward_cost(3, 3) == pytest.approx(2.0)  # the measured point
    assert joint.call_forward_cost(3, 2) == pytest.approx(1.5 * 1.1 * (1 + g) / 2)  # v's shape, half the correction
    assert joint.call_forward_cost(3, 7) == pytest.approx(1.5 * 2.0 * g)  # beyond: the last correction held
    assert joint.call_forward_cost(1, 3) == pytest.approx(1.2)  # one row: v(w)
    assert joint.call_forward_cost(2, 3) == pytest.approx(1.25 * 1.2 * (1 + g) / 2)  # between one row and three
    m = _two_cycles(proposed_tokens=40, forward_positions=180)  # 3 rows of 3 positions
    assert m.cycle_cost(joint)["target"] == pytest.approx(10 * 2.0)


def test_merge_keeps_labels_and_drops_per_request_values():
    total = RequestMetrics()
    total.merge(RequestMetrics(mode="ar", sd_method="ngram", ttft_seconds=0.5, speedup_estimate=1.2, seconds=2.0))
    total.merge(RequestMetrics(mode="ar", sd_method="ngram", ttft_seconds=0.7, speedup_estimate=1.4, seconds=1.0))
    assert (total.mode, total.sd_method, total.seconds) == ("ar", "ngram", 3.0)
    assert total.ttft_seconds is None and total.speedup_estimate is None


def test_adaptive_gamma_rule():
    ctl = AdaptiveGamma(start=2, max_gamma=4, load_threshold=8, probe_every=3)
    assert ctl.next_gamma(load=0) == 2
    ctl.update(drafted=1, accepted=1, planned=2)  # the chain ended early (EOS): no evidence for depth 2
    assert ctl.next_gamma(0) == 2
    ctl.update(drafted=2, accepted=2, planned=2)
    assert ctl.next_gamma(0) == 3
    ctl.update(3, 0)
    ctl.update(2, 0)
    ctl.update(1, 0)
    assert ctl.gamma == 0
    seq = [ctl.next_gamma(0) for _ in range(6)]
    assert seq == [0, 0, 1, 0, 0, 1]  # a probe cycle every 3rd cycle at gamma 0
    ctl.update(1, 1)  # the probe's draft was accepted: recover
    assert ctl.gamma == 1
    busy = AdaptiveGamma(start=8, max_gamma=8, load_threshold=8, probe_every=2)
    # the cap falls linearly from max_gamma at 1 request in flight to 0 at load_threshold requests
    assert [busy.next_gamma(load=n) for n in (1, 4)] == [8, 4]  # 8 * (8 - 4) // 7
    assert [busy.next_gamma(load=16) for _ in range(4)] == [0, 0, 0, 0]  # overloaded: no probes either
    assert busy.next_gamma(load=2) == 0 and busy.next_gamma(load=2) == 1  # the cap allows probes again
    assert AdaptiveGamma(start=3, max_gamma=3, load_threshold=0).next_gamma(load=100) == 3  # 0: load ignored


@pytest.mark.parametrize("kwargs, field", [
    ({"gamma": -1}, "gamma"), ({"gamma": 9}, "gamma"), ({"mode": "fast"}, "mode"), ({"width": 0}, "width"),
    ({"max_tokens": 0}, "max_tokens"), ({"stop": ("",)}, "stop"), ({"judge": {"name": "oracle"}}, "name"),
])
def test_options_reject_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LROptions(**kwargs)
