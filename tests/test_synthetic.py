"""The synthetic reasoning task: determinism, solution correctness, labels of the judge pairs."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lookahead_reasoning.evaluation import synthetic as syn
from lookahead_reasoning.evaluation.synthetic import Computation, extract_answer, parse_step, steps_equivalent

STEP_RANGES = {1: (2, 3), 2: (2, 5), 3: (3, 6), 4: (4, 8), 5: (5, 8)}


def check_problem(p: syn.Problem) -> None:
    """Every step holds one correct computation whose operands are question numbers or earlier results,
    and the last result is the stated answer."""
    assert p.steps and len(p.steps) == len(p.computations) == len(p.kinds)
    lo, hi = STEP_RANGES[p.difficulty]
    assert lo <= len(p.steps) <= hi
    assert syn.MIN_STEPS <= len(p.steps) <= syn.MAX_STEPS
    available = {int(x) for x in re.findall(r"\d+", p.question)}
    if "doubles" in p.question:
        available.add(2)
    if "triples" in p.question:
        available.add(3)
    for step, comp in zip(p.steps, p.computations, strict=False):
        assert "\n" not in step and step == step.strip()
        parsed = parse_step(step)
        assert parsed is not None, step
        assert parsed.canonical() == comp.canonical(), (step, comp)
        assert parsed.is_correct(), step
        assert set(parsed.operands) <= available, (p.question, step, available)
        available.add(parsed.result)
    assert p.computations[-1].result == p.answer
    assert p.solution == "\n\n".join(p.steps) + f"\n\n#### {p.answer}"
    assert extract_answer(p.solution) == p.answer
    assert p.answer >= 0


def test_deterministic_per_seed():
    a = syn.generate_problems(30, seed=123)
    b = syn.generate_problems(30, seed=123)
    assert a == b
    assert [p.solution for p in a] == [p.solution for p in b]
    assert syn.generate_problems(10, seed=123) == a[:10]  # prefix does not depend on n
    c = syn.generate_problems(30, seed=124)
    assert [p.question for p in a] != [p.question for p in c]
    for d in syn.DIFFICULTIES:
        assert syn.generate_problems(5, 9, d) == syn.generate_problems(5, 9, d)


def test_default_difficulty_and_eval_seed():
    assert syn.generate_problems(4, syn.EVAL_SEED) == syn.generate_problems(4, syn.EVAL_SEED, syn.DEFAULT_DIFFICULTY)
    assert syn.is_reserved_seed(syn.EVAL_SEED) and syn.is_reserved_seed(syn.JUDGE_EVAL_SEED)
    assert not syn.is_reserved_seed(0)


@pytest.mark.parametrize("difficulty", syn.DIFFICULTIES)
def test_every_solution_computes_its_answer(difficulty):
    for p in syn.generate_problems(300, seed=1000 + difficulty, difficulty=difficulty):
        check_problem(p)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), difficulty=st.sampled_from(syn.DIFFICULTIES))
def test_property_any_seed(seed, difficulty):
    for p in syn.generate_problems(3, seed, difficulty):
        check_problem(p)


def test_all_step_counts_occur():
    counts = {len(p.steps) for d in syn.DIFFICULTIES for p in syn.generate_problems(200, 5, d)}
    assert counts == set(range(2, 9))


def test_wording_is_a_function_of_the_problem_and_varies():
    ps = syn.generate_problems(400, seed=77)
    first_words = {p.steps[0].split()[0] for p in ps}
    assert len(first_words) >= 3  # several sentence frames are in use
    # same (context, position) -> same wording choice
    for p in ps[:50]:
        for j in range(len(p.steps)):
            assert syn.step_style(p.context, j) == syn.step_style(p.context, j)
            frame, order = syn.step_style(p.context, j)
            assert (syn.render_step(p.kinds[j], p.computations[j], p.context, frame, order, p.step_slots[j])
                    == p.steps[j])
    # commutative operands appear in both orders across problems
    swapped = sum(
        1 for p in ps for s, c in zip(p.steps, p.computations, strict=False)
        if c.op in "+x" and parse_step(s).operands != c.operands
    )
    assert swapped > 50


def test_parse_step_and_extract_answer():
    assert parse_step("Now she has 48 - 9 = 39 pencils.") == Computation("-", (48, 9), 39)
    assert parse_step("12 * 3 = 36") == Computation("x", (12, 3), 36)
    assert parse_step("So it is 72 ÷ 8 = 9.\n\n") == Computation("/", (72, 8), 9)
    assert parse_step("No numbers here.") is None
    assert parse_step("1 + 2 = 3 and 3 + 4 = 7") is None  # ambiguous: two computations
    assert extract_answer("blah\n\n#### 42") == 42
    assert extract_answer("#### 1,234") == 1234
    assert extract_answer("The answer is 5.") is None


def test_steps_equivalent():
    assert steps_equivalent("Mia has 4 x 12 = 48 pencils.", "12 x 4 = 48.")
    assert steps_equivalent("That makes 30 + 9 = 39.", "9 + 30 = 39 apples in total.")
    assert not steps_equivalent("That leaves 48 - 9 = 39.", "9 - 48 = 39.")  # order matters for -
    assert not steps_equivalent("4 x 12 = 48.", "4 x 12 = 46.")
    assert not steps_equivalent("4 x 12 = 48.", "4 + 12 = 48.")
    assert not steps_equivalent("4 x 12 = 48.", "#### 48")
    assert steps_equivalent("#### 48", "####  48")
    assert not steps_equivalent("#### 48", "#### 49")


def test_step_pairs_labels_and_balance():
    pairs = syn.generate_step_pairs(2000, seed=3)
    assert pairs == syn.generate_step_pairs(2000, seed=3)
    assert all(y == steps_equivalent(a, b) for a, b, y in pairs)
    pos = sum(y for *_, y in pairs)
    assert 0.4 * len(pairs) < pos < 0.6 * len(pairs)
    # most positives are NOT identical texts (the judge must look past wording)
    assert sum(1 for a, b, y in pairs if y and a != b) > 0.8 * pos
    # hard negatives: some differ from their partner only in one digit
    one_digit = sum(
        1 for a, b, y in pairs
        if not y and len(a) == len(b) and sum(x != z for x, z in zip(a, b, strict=False)) == 1
    )
    assert one_digit > 50
    assert all(isinstance(a, str) and isinstance(b, str) and a.strip() == a for a, b, _ in pairs)


def test_bad_arguments():
    with pytest.raises(ValueError):
        syn.generate_problems(1, 0, difficulty=9)
    with pytest.raises(ValueError):
        syn.generate_problems(-1, 0)
    with pytest.raises(ValueError, match="style"):
        syn.generate_problems(1, 0, style="medium")
    with pytest.raises(ValueError, match="style"):
        syn.generate_step_pairs(1, 0, style="medium")


# -- the long style: a reasoning trace -------------------------------------------------------------------


def check_long_problem(p: syn.Problem) -> None:
    """Trace structure, every computation and every check correct, every given from the question, every
    summary the running value, and each step's meaning the same in all of its wordings."""
    from lookahead_reasoning.core.steps import split_reasoning

    assert p.style == "long" and len(p.steps) == len(p.specs)
    assert [sp.kind for sp in p.specs[-3:]] == ["conclude", "close", "final"] and p.specs[0].kind == "plan"
    assert p.steps.count("</think>") == 1 and "<think>" not in p.solution
    reasoning, answer = split_reasoning(p.solution, "deepseek_r1")  # the chat template opens <think>
    assert answer.endswith(f"#### {p.answer}") and extract_answer(answer) == p.answer
    assert p.steps[-3] not in answer and p.steps[-1] in answer
    calcs = [sp for sp in p.specs if sp.kind in syn.STEP_KINDS]
    assert tuple(sp.computation for sp in calcs) == p.computations
    events = [sp for sp in p.specs if sp.kind == "given"]
    assert " ".join(sp.sentence for sp in events) + " " in p.question + " "
    assert p.specs[0].value == len(events) - 1
    running = None
    for _i, (sp, text) in enumerate(zip(p.specs, p.steps, strict=False)):
        assert "\n" not in text and text == text.strip()
        if sp.computation is not None:
            parsed = parse_step(text)
            assert parsed is not None and parsed.canonical() == sp.computation.canonical(), text
            assert parsed.is_correct(), text
        if sp.kind in syn.STEP_KINDS:
            last = sp.computation
        if sp.kind == "check":  # the inverse of the event's last computation
            assert sp.computation == syn.inverse_computation(last)
        if sp.kind == "summary":
            running = sp.value
            assert running == last.result
        if sp.kind in ("conclude", "final"):
            assert sp.value == running == p.answer
        meanings = {syn.step_meaning(syn.render_spec(sp, p.context, f, o)) for f in range(3) for o in range(2)}
        assert meanings == {syn.step_meaning(text)}, (sp, meanings)
        assert syn.step_meaning(text)[0] == ("calc" if sp.kind in syn.STEP_KINDS else sp.kind)


@pytest.mark.parametrize("difficulty", syn.DIFFICULTIES)
def test_long_traces_are_correct(difficulty):
    for p in syn.generate_problems(150, seed=2000 + difficulty, difficulty=difficulty, style="long"):
        check_long_problem(p)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), difficulty=st.sampled_from(syn.DIFFICULTIES))
def test_property_long_any_seed(seed, difficulty):
    ps = syn.generate_problems(2, seed, difficulty, style="long")
    assert ps == syn.generate_problems(2, seed, difficulty, style="long")
    for p in ps:
        check_long_problem(p)


def test_long_traces_have_twenty_steps_on_average():
    """Held-out problems at the default difficulty: >= 20 steps per answer on average (the "#### N" line
    counts as a step, as the LR loop splits it)."""
    ps = syn.generate_problems(500, syn.EVAL_SEED, style="long")
    counts = sorted(len(p.steps) + 1 for p in ps)
    assert sum(counts) / len(counts) >= 20
    assert counts[len(counts) // 10] >= 15
    short = syn.generate_problems(500, syn.EVAL_SEED)
    assert [p.question for p in short] != [p.question for p in ps]


def test_step_meaning_tells_kinds_and_contents_apart():
    m = syn.step_meaning
    assert m("Check: 39 + 9 = 48, which matches.") == m("To verify: 9 + 39 = 48.") == ("check", ("+", (9, 39), 48))
    assert m("Check: 39 + 9 = 48, which matches.") != m("39 + 9 = 48.")  # a check is not the computation
    assert m("So far: 39 pencils.") == m("That puts it at 39.") != m("Running total: 38 pencils.")
    assert m("So far: 39 pencils.") != m("So the answer is 39.")
    assert m("Given: She loses 9 pencils.") == m("Next fact: She loses 9 pencils.")
    assert m("Given: She loses 9 pencils.") != m("Given: She finds 9 more pencils.")
    assert m("</think>") == ("close",)
    assert m("#### 12") == ("answer", 12)
    assert m("Something else entirely.") == ("text", "somethingelseentirely.")


def test_long_step_pairs_cover_every_trace_kind():
    pairs = syn.generate_step_pairs(3000, seed=8, style="long")
    assert all(y == steps_equivalent(a, b) for a, b, y in pairs)
    by_kind: dict[str, list[bool]] = {}
    for a, _b, y in pairs:
        by_kind.setdefault(syn.step_meaning(a)[0], []).append(y)
    for kind in ("calc", "check", "given", "summary", "plan", "conclude", "final"):
        labels = by_kind[kind]
        assert len(labels) >= 40 and 0.25 < sum(labels) / len(labels) < 0.75, kind
    # positives are mostly other wordings, not copies
    pos = [(a, b) for a, b, y in pairs if y]
    assert sum(a != b for a, b in pos) > 0.75 * len(pos)


def test_long_wording_is_a_lookup_by_kind_and_varies_across_problems():
    """In a trace the wording of a step is a function of the name, the item and the step's kind (not of its
    index, which a model would have to count), and every frame of a kind is used across problems."""
    ps = syn.generate_problems(300, seed=91, style="long")
    frames: dict[str, set[int]] = {}
    for p in ps:
        for i, (sp, text) in enumerate(zip(p.specs, p.steps, strict=False)):
            style = syn.step_style(p.context, i, sp.kind)
            assert style == syn.step_style(p.context, 0, sp.kind)  # the index plays no part
            assert syn.render_spec(sp, p.context, *style) == text
            frames.setdefault(sp.kind, set()).add(style[0])
    assert all(len(v) == 3 for k, v in frames.items() if k != "close"), frames


@pytest.mark.parametrize("style", syn.STYLES)
def test_the_draft_voice_says_the_same_in_other_words(style):
    """Voice 1 (the draft's training data) keeps every question, answer and step meaning of voice 0 and words
    about half of the steps differently, as a fixed function of the context."""
    a = syn.generate_problems(300, seed=17, style=style)
    b = syn.generate_problems(300, seed=17, style=style, voice=1)
    assert b == syn.generate_problems(300, seed=17, style=style, voice=1)
    same = total = 0
    for p, q in zip(a, b, strict=False):
        assert (p.question, p.answer, p.computations, p.specs) == (q.question, q.answer, q.computations, q.specs)
        assert q.context.voice == 1 and p.context.voice == 0
        for s, t in zip(p.steps, q.steps, strict=False):
            assert steps_equivalent(s, t), (s, t)
            same += s == t
            total += 1
    assert 0.2 < same / total < 0.5, same / total
    assert [p.in_voice(1) for p in a] == b and [q.in_voice(0) for q in b] == a  # re-wording = generating so
    with pytest.raises(ValueError, match="voice"):
        syn.generate_problems(1, 0, voice=len(syn.VOICES))
    with pytest.raises(ValueError, match="voice"):
        a[0].in_voice(2)


def test_the_draft_voice_is_one_lookup_per_part_of_the_context():
    """Voice 1's shift of the frame is the sum of one offset per name, per item and per kind, as voice 0's frame
    is: what changing the name does to it does not depend on the item or the kind (a model learns it part by
    part). A hash of the whole (name, item, kind) key, the voice before 2026-12-05, fails this."""
    ctx = syn.generate_problems(1, seed=3, style="long")[0].context
    names = [n for n, _ in syn._NAMES]
    items = syn._ITEM_KEYS
    kinds = [k for k in syn.STEP_KINDS + syn.TRACE_KINDS if k != "close"]

    def shift(name, item, kind):
        c0 = replace(ctx, name=name, item=item, voice=0)
        f0, o0 = syn.step_style(c0, 0, kind)
        f1, o1 = syn.step_style(replace(c0, voice=1), 0, kind)
        return (f1 - f0) % 3, (o1 - o0) % 2

    for n1, n2 in zip(names, names[1:], strict=False):
        deltas = {tuple((a - b) % m for a, b, m in zip(shift(n2, it, k), shift(n1, it, k), (3, 2), strict=False))
                  for it in items for k in kinds}
        assert len(deltas) == 1, (n1, n2, deltas)


def test_computation_pairs_hold_same_result_negatives():
    """"2 x 40 = 80" against "20 x 4 = 80": other operands, the same result (a false accept of the v2 judge
    that cost a problem under Lookahead Reasoning); never the same computation."""
    pairs = syn.generate_step_pairs(3000, seed=8, style="long")
    found = []
    for a, b, y in pairs:
        ma, mb = (re.search(r"(\d+) ([-+x/]) (\d+) = (\d+)", t) for t in (a, b))
        if ma and mb and ma[4] == mb[4] and ma[2] == mb[2] and {ma[1], ma[3]} != {mb[1], mb[3]}:
            found.append((a, b, y))
    assert len(found) >= 30
    assert not any(y for *_, y in found)


def test_long_step_pairs_hold_event_negatives_and_every_kind_often():
    """Judge pairs: a restated given against another event of the problem with the same numbers (the words of
    the event are all that differ), and the one-per-problem kinds about as often as computations."""
    pairs = syn.generate_step_pairs(3000, seed=8, style="long")
    kinds = [syn.step_meaning(a)[0] for a, _, _ in pairs]
    counts = {k: kinds.count(k) for k in set(kinds)}
    assert min(counts[k] for k in ("plan", "conclude", "final", "summary")) > 0.3 * counts["given"]
    event_negatives = [
        (a, b) for (a, b, y), k in zip(pairs, kinds, strict=False)
        if k == "given" and not y and syn.step_meaning(b)[0] == "given"
        and re.findall(r"\d+", a) == re.findall(r"\d+", b)]
    assert len(event_negatives) >= 10
    assert all(syn.step_meaning(a) != syn.step_meaning(b) for a, b in event_negatives)


def test_derive_seed_is_deterministic_and_never_a_held_out_seed():
    seeds = [syn.derive_seed(0, "train", i) for i in range(2000)]
    assert seeds == [syn.derive_seed(0, "train", i) for i in range(2000)]
    assert len(set(seeds)) == len(seeds) and not any(syn.is_reserved_seed(s) for s in seeds)
    assert syn.derive_seed(0, "a") != syn.derive_seed(0, "b") != syn.derive_seed(1, "b")


def test_step_pairs_of_chosen_kinds():
    """``kinds`` pairs only steps of those kinds (the judge's extra restated givens); the default set of pairs
    is the same with ``kinds=None``; a kind the task does not have is refused."""
    pairs = syn.generate_step_pairs(600, seed=4, style="long", kinds=("given",))
    assert pairs == syn.generate_step_pairs(600, seed=4, style="long", kinds=("given",))
    assert all(y == steps_equivalent(a, b) for a, b, y in pairs)
    gold_kinds = {syn.step_meaning(a)[0] if y or syn.step_meaning(a)[0] == "given" else syn.step_meaning(b)[0]
                  for a, b, y in pairs}
    assert gold_kinds == {"given"}
    assert 0.3 < sum(y for *_, y in pairs) / len(pairs) < 0.7
    assert (syn.generate_step_pairs(300, seed=4, style="long", kinds=None)
            == syn.generate_step_pairs(300, seed=4, style="long"))
    for style, bad in (("long", ()), ("long", ("gven",)), ("short", ("given",)), ("long", "given")):
        with pytest.raises(ValueError, match="kinds"):
            syn.generate_step_pairs(1, 0, style=style, kinds=bad)


def test_same_number_pairs_are_what_the_arithmetic_guard_lets_through():
    """The judge's extra pairs: two steps without a computation that state the same numbers (a final answer
    against a running total, a given against another event). Most pass the arithmetic guard, so the words
    decide; about half are not equivalent, labels are ground truth, and the set is deterministic per seed."""
    from lookahead_reasoning.core.verifiers import same_arithmetic

    pairs = syn.generate_same_number_pairs(1000, seed=5)
    assert len(pairs) == 1000 and pairs == syn.generate_same_number_pairs(1000, seed=5)
    assert pairs != syn.generate_same_number_pairs(1000, seed=6)
    assert all(y == steps_equivalent(a, b) for a, b, y in pairs)
    assert all(syn.parse_step(a) is None and syn.parse_step(b) is None for a, b, _ in pairs)
    assert sum(same_arithmetic(a, b) for a, b, _ in pairs) > 0.95 * len(pairs)
    negatives = [(a, b) for a, b, y in pairs if not y]
    assert 0.4 < len(negatives) / len(pairs) < 0.6
    assert all(re.findall(r"\d+", a) and set(re.findall(r"\d+", a)) == set(re.findall(r"\d+", b)) for a, b in negatives)
    assert {syn.step_meaning(a)[0] for a, _ in negatives} >= {"final", "summary", "conclude", "given"}
    assert syn.generate_same_number_pairs(0, seed=5) == []
    with pytest.raises(ValueError, match="n must"):
        syn.generate_same_number_pairs(-1, seed=5)
    for style in ("medium", "short"):  # the short style has no step without a computation: refused, not a hang
        with pytest.raises(ValueError, match="style"):
            syn.generate_same_number_pairs(1, seed=5, style=style)


def test_held_out_judge_pairs_are_pinned():
    """The judge's held-out pairs (every judge figure in the model cards and RESULTS.md) stay the same pairs: a change
    to the pair generator that moves them shows up here, not as a silent change of the evaluation set."""
    import hashlib

    pairs = syn.generate_step_pairs(4000, syn.JUDGE_EVAL_SEED, style="long")
    assert hashlib.md5(repr(pairs).encode()).hexdigest() == "57a509214eb36e8fabddd65262b4e0b8"
