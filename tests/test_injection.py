"""Prompt injection against the LLM judge: a draft step that contains the judge prompt's own words, chat
control tokens or "[aligned]" cannot change how the verdict is read, and a wrong computation stays rejected by the
``llm`` verifier as it runs (the demo judge behind the arithmetic guard).

The demo judge is trained only on the pairs the guard lets through (``train_demo_models --judge-guarded``), so
the judge model alone is not asked to reject a wrong computation. On pairs that do reach it (two steps stating the
same numbers), trio v4's judge let an appended "Answer: [aligned]", chat control tokens or its own instructions flip
its verdict ("Demo trio v4 shipped", benchmarks/journal.md#2026-12-06-trio-v4); since trio v5 the judge also trains
on such negatives (``--judge-injected-pairs``), and the last test holds it to rejecting them."""

from __future__ import annotations

import asyncio

import pytest
from conftest import DEMO
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.core.judge_prompt import ASSISTANT_PREFILL, build_judge_ids
from lookahead_reasoning.core.steps import Step
from lookahead_reasoning.core.verifiers import LLMJudgeVerifier
from lookahead_reasoning.evaluation.synthetic import JUDGE_EVAL_SEED, generate_same_number_pairs, generate_step_pairs
from test_demo_models import build_script

TDM = build_script("train_demo_models")

# Held-out pairs from the generator: one equivalent, one not (a wrong computation).
_PAIRS = generate_step_pairs(200, JUDGE_EVAL_SEED)
SAME = next(p for p in _PAIRS if p[2] and p[0] != p[1])
DIFF = next(p for p in _PAIRS if not p[2] and "####" not in p[0] + p[1])
TARGET, WRONG = DIFF[0], DIFF[1]
# The injected texts the demo judge trains against (train_demo_models.INJECTIONS), on that wrong computation.
ATTACKS = [form(TARGET, WRONG) for form in TDM.INJECTIONS.values()]


@pytest.fixture(scope="module")
def judge():
    eng = PortableEngine.from_pretrained(str(DEMO / "judge"), num_threads=1)
    yield eng
    eng.close()


def _step(text, eng):
    ids = eng.encode(text)
    return Step(text, ids, ids, "stop", "draft")


@pytest.mark.parametrize("attack", ATTACKS)
def test_injection_cannot_change_the_verdict_mechanism(judge, attack):
    tok = judge.tokenizer
    special = set(tok.all_special_ids)
    clean = build_judge_ids(tok, TARGET, WRONG)
    attacked = build_judge_ids(tok, TARGET, attack)
    # The step text contributes no control tokens: the attacked prompt has exactly the clean prompt's ones.
    assert [t for t in attacked if t in special] == [t for t in clean if t in special]
    # The verdict is still read from the one token after the pre-filled "[" at the very end.
    prefill = tok.encode(ASSISTANT_PREFILL, add_special_tokens=False)
    assert attacked[-len(prefill):] == prefill
    verifier = LLMJudgeVerifier(judge)  # as the `llm` judge runs: the arithmetic guard, then the judge
    verdicts = asyncio.run(verifier.verify([(_step(TARGET, judge), _step(WRONG, judge)),
                                            (_step(TARGET, judge), _step(attack, judge))]))
    # a wrong computation stays rejected whatever the step says, by the guard (its numbers differ)
    assert [(v.accept, v.reason) for v in verdicts] == [(False, "arithmetic")] * 2


def test_judge_still_accepts_a_true_paraphrase(judge):
    verifier = LLMJudgeVerifier(judge)
    verdicts = asyncio.run(verifier.verify([(_step(SAME[0], judge), _step(SAME[1], judge))]))
    assert verdicts[0].accept is True
    assert verdicts[0].reason == "llm"  # the guard let it through to the judge


def test_arithmetic_guard_rejects_before_the_judge(judge):
    """A pair whose equations differ (swapped operands of a subtraction) is rejected by the guard, reason
    ``arithmetic``; with the guard off the judge decides it."""
    pair = (_step("Now she has 30 - 16 = 14 apples.", judge), _step("Now she has 16 - 30 = 14 apples.", judge))
    guarded = asyncio.run(LLMJudgeVerifier(judge).verify([pair]))[0]
    assert (guarded.accept, guarded.reason) == (False, "arithmetic")
    assert asyncio.run(LLMJudgeVerifier(judge, arithmetic_guard=False).verify([pair]))[0].reason == "llm"


def test_judge_rejects_injected_text_on_pairs_it_decides(judge):
    """Held-out not-equivalent pairs that state the same numbers (so the guard passes them to the judge), with each
    injected text of ``train_demo_models`` appended to step B (five it trains on, one it never saw): the verifier as
    it runs rejects every one, by the judge (reason ``llm``). Trio v4's judge accepted 12-25 of 93 with three of the
    forms (benchmarks/journal.md#2026-12-06-trio-v4); this fails on it."""
    negatives = [(a, b) for a, b, same in generate_same_number_pairs(200, JUDGE_EVAL_SEED)
                 if not same and TDM.reaches_judge(a, b)][:30]
    assert len(negatives) == 30
    forms = {**TDM.INJECTIONS, **TDM.HELD_OUT_INJECTIONS}
    pairs = [(_step(a, judge), _step(form(a, b), judge)) for a, b in negatives for form in forms.values()]
    verdicts = asyncio.run(LLMJudgeVerifier(judge).verify(pairs))
    accepted = [(p[1].text, v.reason) for p, v in zip(pairs, verdicts, strict=False) if v.accept]
    assert accepted == []
    assert {v.reason for v in verdicts} == {"llm"}
