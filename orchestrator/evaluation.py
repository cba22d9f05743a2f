"""Accuracy and speed evaluation of the modes on a dataset (the ``eval`` command).

Each mode runs every item sequentially (concurrency 1) on the same engines. Reported per mode: accuracy
(with its standard error ``sqrt(p (1 - p) / n)``), output tokens/s (total generated tokens / total seconds),
``speedup_vs_ar`` (that throughput over ``ar``'s), step acceptance rate, and for speculative modes the
analytic estimate of :mod:`.metrics` computed with the run's own acceptance and a calibrated cost model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .answers import check_answer, load_items, EvalItem
from .lookahead import LookaheadReasoner, LROptions


@dataclass
class ModeReport:
    mode: str
    n: int = 0
    correct: int = 0
    graded: int = 0
    tokens: int = 0
    seconds: float = 0.0
    verified_steps: int = 0
    accepted_steps: int = 0
    accepted_by_depth: list[int] = field(default_factory=list)
    verified_by_depth: list[int] = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)
    fallbacks: int = 0
    outputs: list[dict] = field(default_factory=list)

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.graded if self.graded else None

    @property
    def accuracy_stderr(self) -> float | None:
        p = self.accuracy
        return None if p is None else math.sqrt(p * (1 - p) / self.graded)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_steps / self.verified_steps if self.verified_steps else None

    @property
    def acceptance_by_depth(self) -> list[float | None]:
        return [a / v if v else None for a, v in zip(self.accepted_by_depth, self.verified_by_depth)]

    @property
    def speedup_estimate(self) -> float | None:
        return sum(self.estimates) / len(self.estimates) if self.estimates else None


def _add(acc: list[int], xs: list[int]) -> None:
    while len(acc) < len(xs):
        acc.append(0)
    for i, x in enumerate(xs):
        acc[i] += x


def run_eval(reasoner: LookaheadReasoner, items: Sequence[EvalItem], modes: Sequence[str],
             base: LROptions, progress: Callable | None = None, keep_outputs: bool = False) -> dict[str, ModeReport]:
    """Run every item in every mode; returns a :class:`ModeReport` per mode (in ``modes`` order)."""
    reports: dict[str, ModeReport] = {}
    for mode in modes:
        opts = base.model_copy(update={"mode": mode})
        rep = ModeReport(mode)
        for item in items:
            res = reasoner.run(item.prompt, item.messages, opts)
            m = res.metrics
            rep.n += 1
            rep.tokens += m.generated_tokens
            rep.seconds += m.seconds
            rep.verified_steps += m.verified_steps
            rep.accepted_steps += m.accepted_steps
            rep.fallbacks += m.fallbacks
            _add(rep.accepted_by_depth, m.accepted_by_depth)
            _add(rep.verified_by_depth, m.verified_by_depth)
            if m.speedup_estimate is not None:
                rep.estimates.append(m.speedup_estimate)
            ok = check_answer(item, res.text)
            if ok is not None:
                rep.graded += 1
                rep.correct += int(ok)
            if keep_outputs:
                rep.outputs.append({"id": item.id, "text": res.text, "correct": ok})
            if progress:
                progress()
        reports[mode] = rep
    return reports


def report_json(dataset: str, reports: dict[str, ModeReport], extra: dict | None = None) -> dict:
    """The ``--out`` document: ``{"dataset", "n", "modes": {MODE: {...}}}``."""
    ar = reports.get("ar")
    modes = {}
    for mode, r in reports.items():
        modes[mode] = {
            "accuracy": r.accuracy,
            "accuracy_stderr": r.accuracy_stderr,
            "tokens_per_s": r.tokens_per_s,
            "speedup_vs_ar": (r.tokens_per_s / ar.tokens_per_s) if ar and ar.tokens_per_s else None,
            "latency_speedup_vs_ar": (ar.seconds / r.seconds) if ar and r.seconds else None,
            "acceptance_rate": r.acceptance_rate,
            "acceptance_by_depth": r.acceptance_by_depth,
            "speedup_estimate": r.speedup_estimate,
            "generated_tokens": r.tokens,
            "seconds": r.seconds,
            "judge_fallbacks": r.fallbacks,
        }
        if r.outputs:
            modes[mode]["outputs"] = r.outputs
    n = next(iter(reports.values())).n if reports else 0
    doc = {"dataset": dataset, "n": n, "modes": modes}
    if extra:
        doc.update(extra)
    return doc


def write_json(path: str | Path, doc: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


__all__ = ["ModeReport", "run_eval", "report_json", "write_json", "load_items"]
