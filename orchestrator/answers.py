"""Evaluation datasets and answer checking.

Datasets: ``synthetic`` (held-out generator problems: a seed never used in training) and JSONL files in the
formats of ../shared/data: GSM8K (``question`` / ``answer`` with a ``#### N`` line).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EvalItem:
    """One question. Exactly one of ``prompt`` / ``messages`` is set; ``reference`` None means ungraded."""

    id: str
    kind: str
    prompt: str | None
    messages: tuple | None = None
    reference: str | None = None


_GSM_ANSWER = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _num(s: str) -> float | None:
    try:
        return float(s.replace(",", "").replace("$", "").strip())
    except ValueError:
        return None


def extract_gsm8k(text: str) -> float | None:
    """The number after the last ``####`` (``#### 1,000`` -> 1000.0), else the last number in the text."""
    hits = _GSM_ANSWER.findall(text)
    if hits:
        return _num(hits[-1])
    nums = _NUMBER.findall(text)
    return _num(nums[-1]) if nums else None


def load_items(dataset: str, limit: int | None = None) -> list[EvalItem]:
    """Items of ``synthetic`` or a JSONL file (GSM8K format).

    Raises:
        ValueError: unknown dataset or unreadable file (naming it).
    """
    if dataset == "synthetic":
        from .synthetic import DEFAULT_DIFFICULTY, EVAL_SEED, generate_problems

        problems = generate_problems(limit or 200, EVAL_SEED, difficulty=DEFAULT_DIFFICULTY)
        return [EvalItem(f"synthetic-{i}", "synthetic", p.question, None, str(p.answer)) for i, p in enumerate(problems)]
    path = Path(dataset)
    if not path.exists():
        raise ValueError(f"dataset: {dataset!r} is neither 'synthetic' nor an existing file")
    items = []
    with path.open() as f:
        for i, line in enumerate(f):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            row = json.loads(line)
            if "question" in row and "answer" in row:
                ref = extract_gsm8k(row["answer"])
                items.append(EvalItem(f"{path.stem}-{i}", "gsm8k", row["question"], None,
                                      None if ref is None else repr(ref)))
            else:
                raise ValueError(f"dataset: {dataset}: line {i + 1} has no question/answer fields")
    return items


def check_answer(item: EvalItem, text: str) -> bool | None:
    """True/False for graded items, None for ungraded ones."""
    if item.reference is None:
        return None
    if item.kind in ("synthetic", "gsm8k"):
        got = extract_gsm8k(text)
        return got is not None and abs(got - float(item.reference)) < 1e-6
    raise ValueError(f"no answer checker for kind {item.kind!r}")
