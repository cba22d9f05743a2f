"""Evaluation datasets and answer checking.

Datasets, by name (resolved under the data directory: ``$LOOKAHEAD_DATA_DIR``, else the repository's own
``data/`` folder, whose README lists each set's source and licence) or as a JSONL path whose format is
detected from its first row:

- ``synthetic``: held-out generator problems (a seed never used in training); graded on ``#### N``.
- ``gsm8k``: ``question`` / ``answer`` with a ``#### N`` line; graded numerically.
- ``math500``, ``aime2024``: ``problem`` / ``answer``; graded on the last ``\\boxed{}`` of the output,
  normalised (fractions, spaces, LaTeX, units, degrees, thousands commas) and compared as strings, as
  numbers (``0.5`` == ``\\frac{1}{2}``) and element-wise for tuples.
- ``humaneval``: pass@1 by running the program in a subprocess (:mod:`.sandbox`), never in-process.
- ``mt_bench``: two user turns, speed only (no reference: accuracy is None).

Prompts: the plain form (``prompt``) is used for models without a chat template; the chat form
(``messages``) when the model has one. For the math sets the chat form carries the paper's instruction
(arXiv 2506.19830, as Qwen/DeepSeek-R1 evaluations): ``"{question}\\nPlease reason step by step, and put
your final answer within \\boxed{}."``.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.steps import ReasoningParser, split_reasoning

MATH_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one "
                         "```python code block.\n\n```python\n{prompt}```")
DATASET_FILES = {"gsm8k": "gsm8k/test.jsonl", "math500": "math500/test.jsonl", "aime2024": "aime2024/test.jsonl",
                 "humaneval": "humaneval/test.jsonl", "mt_bench": "mt_bench/question.jsonl"}
#: ``synthetic`` is the style the shipped demo trio was trained on (``synthetic.DEFAULT_STYLE``);
#: ``synthetic-short`` / ``synthetic-long`` name a style.
SYNTHETIC = ("synthetic", "synthetic-short", "synthetic-long")
DATASETS = SYNTHETIC + tuple(DATASET_FILES)


@dataclass(frozen=True)
class EvalItem:
    """One question. ``prompt`` is the plain form, ``messages`` the chat form (at least one is set; see
    :meth:`request`). ``reference`` None means ungraded. ``turns`` (MT-Bench) are the user turns of a
    multi-turn chat; ``test`` / ``entry_point`` (HumanEval) are the unit tests and the function they check."""

    id: str
    kind: str
    prompt: str | None
    messages: tuple | None = None
    reference: str | None = None
    turns: tuple[str, ...] | None = None
    test: str | None = None
    entry_point: str | None = None

    def request(self, chat: bool) -> tuple[str | None, list[dict] | None]:
        """``(prompt, messages)`` with exactly one set: the chat form when ``chat`` and the item has one."""
        if (chat and self.messages) or self.prompt is None:
            return None, [dict(m) for m in self.messages]
        return self.prompt, None


def data_dir() -> Path:
    """``$LOOKAHEAD_DATA_DIR``, else ``<repo>/data`` (the benchmark sets this repository carries)."""
    env = os.environ.get("LOOKAHEAD_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data"


def _user(text: str) -> tuple:
    return ({"role": "user", "content": text},)


def _item(kind: str, row: dict, i: int, stem: str) -> EvalItem:
    if kind == "gsm8k":
        ref = row.get("final_answer") or _gsm_number(row["answer"])
        q = row["question"]
        return EvalItem(f"{stem}-{i}", kind, q, _user(f"{q}\n{MATH_SUFFIX}"), None if ref is None else str(ref))
    if kind in ("math500", "aime2024"):
        q = row.get("problem") or row["question"]
        rid = row.get("unique_id") or f"{stem}-{row.get('id', i)}"
        return EvalItem(str(rid), kind, q, _user(f"{q}\n{MATH_SUFFIX}"), str(row["answer"]))
    if kind == "humaneval":
        p = row["prompt"]
        return EvalItem(row["task_id"], kind, p, _user(HUMANEVAL_INSTRUCTION.format(prompt=p)), row["task_id"],
                        test=row["test"], entry_point=row["entry_point"])
    if kind == "mt_bench":
        turns = tuple(row["turns"])
        return EvalItem(f"mt_bench-{row.get('question_id', i)}", kind, turns[0], _user(turns[0]), None, turns=turns)
    raise AssertionError(kind)


def detect_format(row: dict, path: Path) -> str:
    """The dataset kind of a JSONL row (by its keys; ``aime`` in the file path picks AIME over MATH).

    Raises:
        ValueError: an unknown layout (the message lists the row's keys, never its content).
    """
    keys = set(row)
    if "turns" in keys:
        return "mt_bench"
    if {"prompt", "test", "entry_point"} <= keys:
        return "humaneval"
    if {"question", "answer"} <= keys and isinstance(row["answer"], str) and "####" in row["answer"]:
        return "gsm8k"
    if ("problem" in keys or "question" in keys) and "answer" in keys and "choices" not in keys:
        return "aime2024" if "aime" in str(path).lower() else "math500"
    raise ValueError(f"dataset: {path}: unknown row format (keys: {', '.join(sorted(keys))})")


def load_items(dataset: str, limit: int | None = None) -> list[EvalItem]:
    """The first ``limit`` items of a dataset name (:data:`DATASETS`) or of a JSONL file.

    Raises:
        ValueError: unknown dataset, missing or unreadable file, unknown format (naming it).
    """
    if dataset in SYNTHETIC:
        from .synthetic import DEFAULT_DIFFICULTY, DEFAULT_STYLE, EVAL_SEED, generate_problems

        style = dataset.partition("-")[2] or DEFAULT_STYLE
        problems = generate_problems(limit or 200, EVAL_SEED, difficulty=DEFAULT_DIFFICULTY, style=style)
        return [EvalItem(f"{dataset}-{i}", "synthetic", p.question, None, str(p.answer))
                for i, p in enumerate(problems)]
    if dataset in DATASET_FILES:
        path, stem = data_dir() / DATASET_FILES[dataset], dataset
        if not path.exists():
            raise ValueError(f"dataset: {dataset}: {path} not found (set LOOKAHEAD_DATA_DIR)")
    else:
        path = Path(dataset)
        stem = path.stem
        if not path.is_file():
            raise ValueError(f"dataset: {dataset!r} is neither one of {', '.join(DATASETS)} nor an existing file")
        if path.suffix != ".jsonl":
            raise ValueError(f"dataset: {dataset}: expected a .jsonl file")
    items: list[EvalItem] = []
    kind = None
    with path.open() as f:
        for i, line in enumerate(f):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"dataset: {path}: line {i + 1} is not JSON ({exc.msg})") from None
            kind = kind or (dataset if dataset in DATASET_FILES else detect_format(row, path))
            try:
                items.append(_item(kind, row, i, stem))
            except KeyError as exc:
                raise ValueError(f"dataset: {path}: line {i + 1} has no {exc.args[0]!r} field") from None
    return items


# -- extraction -------------------------------------------------------------------------------------------
_GSM_ANSWER = re.compile(r"####\s*\\?\$?\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _num(s: str) -> float | None:
    try:
        return float(s.replace(",", "").replace("$", "").strip())
    except ValueError:
        return None


def _gsm_number(text: str) -> str | None:
    hits = _GSM_ANSWER.findall(text)
    return hits[-1].replace(",", "") if hits else None


def extract_gsm8k(text: str) -> float | None:
    """The number after the last ``####`` (``#### $1,000.00`` -> 1000.0), else the last number in the text."""
    hits = _GSM_ANSWER.findall(text)
    if hits:
        return _num(hits[-1])
    nums = _NUMBER.findall(text)
    return _num(nums[-1]) if nums else None


def _braced(s: str, i: int) -> tuple[str, int] | None:
    """Content of the brace group opening at ``s[i] == '{'`` and the index after it (None if unbalanced)."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{" and (j == 0 or s[j - 1] != "\\"):
            depth += 1
        elif s[j] == "}" and s[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return s[i + 1:j], j + 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces matched), or ``\\boxed 5``."""
    i = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if i < 0:
        return None
    j = i + (6 if text.startswith("\\boxed", i) else 5)
    if text[j:j + 1] == "{":
        got = _braced(text, j)
        return got[0] if got else None
    m = re.match(r"\s+([^\s$]+)", text[j:])
    return m.group(1) if m else None


def final_answer(text: str) -> str | None:
    """The answer string of a reasoning output: last ``\\boxed{}``, else the last ``#### X`` line."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    hits = re.findall(r"####\s*(.+)", text)
    return hits[-1].strip() if hits else None


# -- normalisation and equivalence ----------------------------------------------------------------------------
_UNWRAP = ("text", "textbf", "textrm", "mathrm", "mathbf", "mbox", "boxed", "fbox", "textit", "operatorname")
_UNITS = re.compile(r"(\S*?[\d}])\s+(?:[A-Za-z]{2,}\.?(?:\s*\^\{?\d\}?)?\s*)+")


def _unwrap(s: str) -> str:
    """``\\text{ cm}`` -> `` cm `` (content with spaces around) for the commands of ``_UNWRAP``."""
    pat = re.compile(r"\\(?:{})\s*\{{".format("|".join(_UNWRAP)))
    while (m := pat.search(s)) is not None:
        got = _braced(s, m.end() - 1)
        if got is None:
            break
        s = s[:m.start()] + " " + got[0] + " " + s[got[1]:]
    return s


def normalize_math(s: str) -> str:
    """A canonical string for a final answer (MATH-style ``strip_string``, written for this project)."""
    s = _unwrap(str(s).strip())
    for a, b in (("\\$", ""), ("$", ""), ("\\left", ""), ("\\right", ""), ("\\displaystyle", ""), ("\\dfrac", "\\frac"),
                 ("\\tfrac", "\\frac"), ("^{\\circ}", ""), ("^\\circ", ""), ("\\circ", ""), ("°", ""), ("\\%", ""),
                 ("%", ""), ("\\!", ""), ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "), ("\\quad", " "),
                 ("~", " "), ("\n", " ")):
        s = s.replace(a, b)
    s = s.strip().rstrip(".").strip()
    m = re.fullmatch(r"[A-Za-z]\w{0,2}\s*=\s*(.+)", s)  # "x = 5" -> "5"
    if m and "=" not in m.group(1):
        s = m.group(1)
    m = _UNITS.fullmatch(s)  # "5 cm^2" -> "5", "18 dollars" -> "18"
    if m:
        s = m.group(1)
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)
    s = re.sub(r"([\^_])\{(\w)\}", r"\1\2", s)      # "b^{2}" -> "b^2"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d.])0+(?=\d)", "", s)          # "025" -> "25"
    s = re.sub(r"(?<![\d])\.(?=\d)", "0.", s)         # ".5" -> "0.5"
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if m:
        s = f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    m = re.fullmatch(r"\(([A-Ea-e])\)", s)            # "(A)" / "\text{(A)}" -> "A"
    if m:
        s = m.group(1).upper()
    return s


def _latex_to_py(s: str) -> str | None:
    """A Python arithmetic expression for a normalised LaTeX number, or None."""
    while (m := re.search(r"\\(frac|sqrt)", s)) is not None:
        i, j, root = m.start(), m.end(), None
        if m.group(1) == "sqrt" and s[j:j + 1] == "[":
            k = s.find("]", j)
            if k < 0:
                return None
            root, j = s[j + 1:k], k + 1
        a = _braced(s, j) if s[j:j + 1] == "{" else None
        if a is None:
            return None
        if m.group(1) == "frac":
            b = _braced(s, a[1]) if s[a[1]:a[1] + 1] == "{" else None
            if b is None:
                return None
            s = s[:i] + f"(({a[0]})/({b[0]}))" + s[b[1]:]
        else:
            s = s[:i] + (f"(({a[0]})**(1/({root})))" if root else f"sqrt({a[0]})") + s[a[1]:]
    for a, b in (("\\cdot", "*"), ("\\times", "*"), ("\\div", "/"), ("\\pi", "pi"), ("^", "**"), ("{", "("),
                 ("}", ")")):
        s = s.replace(a, b)
    if "\\" in s or re.search(r"[A-Za-z_]", re.sub(r"pi|sqrt", "", s)):
        return None
    return re.sub(r"(?<=[\d)])(?=[(a-z])", "*", s)  # implicit products: 3sqrt(2), 2pi, )(


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id == "pi":
        return math.pi
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sqrt"
            and len(node.args) == 1):
        return math.sqrt(_eval(node.args[0]))
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left), _eval(node.right)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.Div: lambda: a / b,
               ast.Pow: lambda: a ** b if abs(b) <= 64 and abs(a) <= 1e6 else math.nan}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    raise ValueError("not a number")


def to_number(s: str) -> float | None:
    """Value of a normalised answer made of numbers, ``+ - * / ^``, ``\\frac``, ``\\sqrt``, ``\\pi``, or None.
    Parsed with :mod:`ast` and a whitelist evaluator: model text is never ``eval``-ed."""
    expr = _latex_to_py(s)
    if not expr:
        return None
    try:
        v = _eval(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError):
        return None
    return v if isinstance(v, float) and math.isfinite(v) else None


def _split_tuple(s: str) -> tuple[str, list[str]] | None:
    """``(a,b)`` -> (``"()"``, [a, b]) splitting on top-level commas; None for a single element."""
    brackets = s[:1] + s[-1:] if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" else ""
    body = s[1:-1] if brackets else s
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return (brackets, parts) if len(parts) > 1 else None


def math_equal(pred: str | None, ref: str) -> bool:
    """True if two final answers are equivalent: equal normalised strings, equal values (relative tolerance
    1e-6), or tuples/intervals with the same brackets and equivalent elements."""
    if pred is None:
        return False
    a, b = normalize_math(pred), normalize_math(ref)
    if a == b:
        return True
    va, vb = to_number(a), to_number(b)
    if va is not None and vb is not None:
        return abs(va - vb) <= 1e-6 * max(1.0, abs(vb))
    ta, tb = _split_tuple(a), _split_tuple(b)
    if ta and tb and ta[0] == tb[0] and len(ta[1]) == len(tb[1]):
        return all(math_equal(x, y) for x, y in zip(ta[1], tb[1], strict=False))
    return False


def check_answer(item: EvalItem, text: str, reasoning_parser: ReasoningParser = "qwen3") -> bool | None:
    """True/False for graded items, None for ungraded ones (MT-Bench). HumanEval runs in a subprocess.

    Only the final answer is graded, never the reasoning: ``text`` is split by ``reasoning_parser``
    (:func:`~lookahead_reasoning.core.steps.split_reasoning`); an answer still inside an unclosed reasoning block
    has no final answer and is wrong.
    """
    if item.reference is None:
        return None
    text = split_reasoning(text, reasoning_parser)[1]
    if item.kind in ("synthetic", "gsm8k"):
        boxed = last_boxed(text)
        got = to_number(normalize_math(boxed)) if boxed is not None else extract_gsm8k(text)
        return got is not None and abs(got - float(item.reference)) < 1e-6 * max(1.0, abs(float(item.reference)))
    if item.kind in ("math500", "aime2024"):
        return math_equal(final_answer(text), item.reference)
    if item.kind == "humaneval":
        from .sandbox import check_humaneval

        return check_humaneval(item, text).passed
    raise ValueError(f"no answer checker for kind {item.kind!r}")
