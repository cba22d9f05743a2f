"""Answer extraction and normalisation on tricky real formats; dataset loading from the repository's data/.

GPQA is never read or printed here (the dataset is not supported by design)."""

from __future__ import annotations

import json

import pytest
from lookahead_reasoning.evaluation.answers import (
    DATASET_FILES,
    MATH_SUFFIX,
    EvalItem,
    check_answer,
    data_dir,
    extract_gsm8k,
    final_answer,
    last_boxed,
    load_items,
    normalize_math,
    to_number,
)


def gsm(ref: str) -> EvalItem:
    return EvalItem("g", "gsm8k", "q", None, ref)


def math_item(ref: str) -> EvalItem:
    return EvalItem("m", "math500", "q", None, ref)


@pytest.mark.parametrize("text,expected", [
    ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac{3}{4}}", "\\dfrac{3}{4}"),
    ("first \\boxed{1} then \\boxed{\\left\\{ x \\mid x^{2} \\in \\{1, 4\\} \\right\\}}",
     "\\left\\{ x \\mid x^{2} \\in \\{1, 4\\} \\right\\}"),
    ("$\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),
    ("\\fbox{7}", "7"),
    ("\\boxed 5$", "5"),
    ("no box here", None),
    ("unbalanced \\boxed{\\frac{1}{2}", None),
])
def test_last_boxed_matches_nested_braces(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("text,value", [
    ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", 18.0),
    ("#### 1,000", 1000.0),
    ("#### $1,000.00", 1000.0),
    ("#### -5", -5.0),
    ("#### 18.", 18.0),
    ("The total is 1,234 apples and 7 pears.", 7.0),  # no ####: last number
])
def test_extract_gsm8k(text, value):
    assert extract_gsm8k(text) == value


@pytest.mark.parametrize("text,ref,ok", [
    ("#### 1,000", "1000", True),
    ("#### $1,000.00", "1000", True),
    ("... so she makes \\boxed{18} dollars.", "18", True),
    ("\\boxed{18 \\text{ dollars}}", "18", True),
    ("\\boxed{\\$18.00}", "18", True),
    ("\\boxed{1,000}", "1000", True),
    ("The answer is 18 dollars", "18", True),
    ("#### 17", "18", False),
    ("no answer at all", "18", False),
])
def test_gsm8k_checker(text, ref, ok):
    assert check_answer(gsm(ref), text) is ok


@pytest.mark.parametrize("pred,ref", [
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34"),
    ("\\boxed{\\tfrac{14}{3}}", "\\frac{14}{3}"),
    ("\\boxed{14/3}", "\\frac{14}{3}"),
    ("\\boxed{.5}", "\\frac{1}{2}"),
    ("\\boxed{5 cm^2}", "5"),
    ("\\boxed{5\\text{ cm}^2}", "5"),
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("\\boxed{\\text{(A)}}", "A"),
    ("\\boxed{(C)}", "\\text{(C)}"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{90^{\\circ}}.", "90"),
    ("\\boxed{25\\%}", "25"),
    ("\\boxed{025}", "25"),  # AIME references keep leading zeros
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{3\\sqrt{13}}", "3\\sqrt{13}"),
    ("\\boxed{3 \\sqrt{13}}", "\\sqrt{117}"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\boxed{6 - 5i}", "6-5i"),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}"),
    ("\\boxed{2^{10}}", "1024"),
    ("\\boxed{\\frac{a}{\\sqrt{b^{2}}}}", "\\frac{a}{\\sqrt{b^2}}"),
    ("\\boxed{1,-2}", "1, -2"),
    ("\\boxed{\\$1,000}", "1000"),
])
def test_math_equivalent_forms(pred, ref):
    assert check_answer(math_item(ref), f"Step 1 ...\n\nSo the answer is {pred}"), (pred, ref)


@pytest.mark.parametrize("pred,ref", [
    ("\\boxed{\\frac{1}{3}}", "0.33"),
    ("\\boxed{2}", "3"),
    ("\\boxed{(3, \\pi)}", "[3, \\pi]"),   # brackets matter for intervals
    ("\\boxed{1,2}", "1, 2, 3"),
    ("\\boxed{9^{9^{9}}}", "1"),          # huge powers are not evaluated
    ("the answer is 5", "5"),             # math sets need \boxed{}
])
def test_math_non_equivalent(pred, ref):
    assert not check_answer(math_item(ref), pred)


def test_normalisation_and_safe_numbers():
    assert normalize_math("\\left( 3, \\frac{\\pi}{2} \\right)") == "(3,\\frac{\\pi}{2})"
    assert normalize_math("\\dfrac12") == "\\frac{1}{2}"
    assert normalize_math("10\\text{ inches}.") == "10"
    assert to_number("\\frac{\\sqrt{2}}{2}") == pytest.approx(2 ** 0.5 / 2)
    assert to_number("2\\pi") == pytest.approx(6.283185307)
    assert to_number("__import__('os')") is None  # never eval-ed
    assert to_number("x+1") is None and to_number("1/0") is None
    assert final_answer("#### 42") == "42"


def test_every_dataset_loads_three_items():
    for name in ("gsm8k", "math500", "aime2024", "humaneval", "mt_bench", "synthetic"):
        items = load_items(name, 3)
        assert len(items) == 3 and len({i.id for i in items}) == 3, name
        assert all(i.kind == name for i in items)
    g = load_items("gsm8k", 1)[0]
    assert g.reference == "18" and g.prompt.startswith("Janet")
    prompt, messages = g.request(chat=True)
    assert prompt is None and messages[0]["content"].endswith("\n" + MATH_SUFFIX)
    assert g.request(chat=False) == (g.prompt, None)
    m = load_items("math500", 1)[0]
    assert m.reference == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert load_items("aime2024", 1)[0].reference == "204"
    h = load_items("humaneval", 1)[0]
    assert h.entry_point == "has_close_elements" and "def check" in h.test and h.prompt.startswith("from typing")
    mt = load_items("mt_bench", 1)[0]
    assert mt.reference is None and len(mt.turns) == 2 and mt.prompt == mt.turns[0]
    assert check_answer(mt, "anything") is None
    assert load_items("synthetic", 1)[0].request(chat=True)[0] is not None  # no chat form: plain prompt


def test_data_dir_override_and_format_detection(tmp_path, monkeypatch):
    gpqa = data_dir() / "gpqa_diamond" / "test.jsonl.gz"
    for name, rel in DATASET_FILES.items():
        lines = (data_dir() / rel).read_text().splitlines()[:2]
        path = tmp_path / f"{name}_copy.jsonl"
        path.write_text("\n".join(lines) + "\n")
        assert [i.kind for i in load_items(str(path))] == [name] * 2, name
    monkeypatch.setenv("LOOKAHEAD_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="LOOKAHEAD_DATA_DIR"):
        load_items("gsm8k")
    (tmp_path / "odd.jsonl").write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(ValueError, match="unknown row format"):
        load_items(str(tmp_path / "odd.jsonl"))
    with pytest.raises(ValueError, match="neither"):
        load_items("gpqa")
    with pytest.raises(ValueError, match=".jsonl"):  # rejected by name, the file is not opened
        load_items(str(gpqa))


def test_reference_solutions_grade_correct():
    """The last \\boxed{} of every MATH-500 reference solution matches its answer field."""
    rows = [json.loads(x) for x in (data_dir() / DATASET_FILES["math500"]).read_text().splitlines()]
    items = load_items("math500")
    assert sum(check_answer(i, r["solution"]) for i, r in zip(items, rows, strict=False)) == len(rows) == 500


def test_only_the_final_answer_is_graded_not_the_reasoning():
    item = EvalItem("s", "synthetic", "q", None, "12")
    trace = "Running total: 12 dollars.\n\nSo the answer is 12.\n\n"
    # the trace ends on the right number, but a trace without </think> has no final answer yet
    assert check_answer(item, trace, "deepseek_r1") is False
    assert check_answer(item, trace + "</think>\n\nAnswer: 12.\n\n#### 12", "deepseek_r1") is True
    assert check_answer(item, "<think>" + trace + "</think>\n\nAnswer: 13.\n\n#### 13", "qwen3") is False
    assert check_answer(item, "Total: 12 dollars.\n\n#### 12", "none") is True


def test_synthetic_datasets_by_style():
    from lookahead_reasoning.evaluation import synthetic as syn

    for name, style in (("synthetic", syn.DEFAULT_STYLE), ("synthetic-short", "short"), ("synthetic-long", "long")):
        items = load_items(name, 3)
        want = syn.generate_problems(3, syn.EVAL_SEED, style=style)
        assert [i.prompt for i in items] == [p.question for p in want]
        assert [i.reference for i in items] == [str(p.answer) for p in want] and items[0].kind == "synthetic"
