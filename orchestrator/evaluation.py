"""Accuracy and speed evaluation of the modes on a dataset (the ``eval`` command).

Each mode runs every item sequentially (concurrency 1) on the same engines. Reported per mode: accuracy
(with its standard error ``sqrt(p (1 - p) / n)``), output tokens/s (total generated tokens / total seconds),
``speedup_vs_ar`` (that throughput over ``ar``'s), step acceptance rate (accepted / verified drafted steps,
also per depth), and for speculative modes the analytic estimate of :mod:`.metrics` computed with the run's
own acceptance and a calibrated cost model.

Prompts: an item's chat form (the paper's math instruction, the HumanEval instruction) is used when the
target has a chat template (the same test as :meth:`LookaheadReasoner.prompt_ids`), else its plain form.
MT-Bench items are two-turn chats: turn 2 is asked after the model's own turn-1 answer; speed counts both
turns. Items whose prompt does not fit the target's context window are skipped and counted.

Gamma sweep (:func:`run_gamma_sweep`): one speculative mode at several lookahead depths; speedup at each is
that run's output tokens/s over the ``ar`` run's on the same items.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .answers import check_answer, load_items, EvalItem
from .lookahead import LookaheadReasoner, LROptions, with_overrides
from .metrics import RequestMetrics


@dataclass
class ModeReport:
    """One mode over a dataset: accuracy counts, and ``totals``, every request's :class:`RequestMetrics`
    merged (so rates and the speed-model estimate come from the run's totals, not averages of ratios)."""

    mode: str
    n: int = 0
    correct: int = 0
    graded: int = 0
    skipped: int = 0
    turns: int = 0
    outputs: list[dict] = field(default_factory=list)
    totals: RequestMetrics = field(default_factory=RequestMetrics)
    cost_model: object = None  # the calibration.CostModel the run was estimated with, if any

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.graded if self.graded else None

    @property
    def accuracy_stderr(self) -> float | None:
        p = self.accuracy
        return None if p is None else math.sqrt(p * (1 - p) / self.graded)

    @property
    def tokens(self) -> int:
        return self.totals.generated_tokens

    @property
    def seconds(self) -> float:
        return self.totals.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.totals.tokens_per_s

    @property
    def acceptance_rate(self) -> float | None:
        return self.totals.acceptance_rate

    @property
    def acceptance_by_depth(self) -> list[float | None]:
        t = self.totals
        return [a / v if v else None for a, v in zip(t.accepted_by_depth, t.verified_by_depth)]

    def estimate(self, ar: "ModeReport | None" = None, **kw) -> float | None:
        """The speed model's prediction of ``speedup_vs_ar``: equation (1) of :mod:`.metrics` on this run's totals
        divided by equation (1)
        for ``ar``, the ``ar`` run on the same items (both charge the prompts' prefill, so an ``ar`` run is
        exactly 1.0); the undivided estimate without ``ar``. ``kw``: ``iid`` or ``free_draft_and_judge`` of
        :meth:`.metrics.RequestMetrics.estimate` for this run."""
        est = self.totals.estimate(self.cost_model, **kw)
        base = ar.totals.estimate(ar.cost_model) if ar is not None else None
        return est / base if est is not None and base else est


def uses_chat_template(reasoner: LookaheadReasoner) -> bool:
    """Whether plain prompts get the target's chat template (the test of ``LookaheadReasoner.prompt_ids``)."""
    tok = getattr(reasoner.target, "tokenizer", None)
    return bool(getattr(tok, "chat_template", None)) and reasoner.use_chat_template


def _too_long(exc: ValueError) -> bool:
    return str(exc).startswith("prompt:") and "context window" in str(exc)


def _run_item(reasoner: LookaheadReasoner, item: EvalItem, opts: LROptions, chat: bool) -> list:
    """The :class:`LRResult` of each turn (one unless the item has ``turns``)."""
    if not item.turns:
        prompt, messages = item.request(chat)
        return [reasoner.run(prompt, messages, opts)]
    results, messages = [], []
    for k, turn in enumerate(item.turns):
        messages.append({"role": "user", "content": turn})
        try:
            res = reasoner.run(None, list(messages), opts)
        except ValueError as exc:
            if k == 0 or not _too_long(exc):
                raise
            break  # a later turn no longer fits the context window: keep the turns answered so far
        results.append(res)
        messages.append({"role": "assistant", "content": res.text})
    return results


def run_mode(reasoner: LookaheadReasoner, items: Sequence[EvalItem], opts: LROptions,
             progress: Callable | None = None, keep_outputs: bool = False) -> ModeReport:
    """Every item in one mode (``opts.mode``); grades the last turn's text."""
    chat = uses_chat_template(reasoner)
    rep = ModeReport(opts.mode, cost_model=reasoner.cost_model)
    for item in items:
        try:
            results = _run_item(reasoner, item, opts, chat)
        except ValueError as exc:
            if not _too_long(exc):
                raise
            rep.skipped += 1
            results = []
        for res in results:
            rep.turns += 1
            rep.totals.merge(res.metrics)
        if results:
            rep.n += 1
            ok = check_answer(item, results[-1].text)
            if ok is not None:
                rep.graded += 1
                rep.correct += int(ok)
            if keep_outputs:
                texts = [r.text for r in results]
                rep.outputs.append({"id": item.id, "text": texts if item.turns else texts[0], "correct": ok})
        if progress:
            progress()
    return rep


def run_eval(reasoner: LookaheadReasoner, items: Sequence[EvalItem], modes: Sequence[str],
             base: LROptions, progress: Callable | None = None, keep_outputs: bool = False) -> dict[str, ModeReport]:
    """Run every item in every mode; returns a :class:`ModeReport` per mode (in ``modes`` order)."""
    return {mode: run_mode(reasoner, items, base.model_copy(update={"mode": mode}), progress, keep_outputs)
            for mode in modes}


def run_gamma_sweep(reasoner: LookaheadReasoner, items: Sequence[EvalItem], mode: str, gammas: Sequence[int],
                    base: LROptions, baseline: ModeReport | None = None, done: dict[int, ModeReport] | None = None,
                    progress: Callable | None = None) -> list[dict]:
    """``mode`` at each gamma in ``gammas``; returns one row per gamma: ``{"gamma", "tokens_per_s",
    "speedup_vs_ar", "acceptance_rate", "acceptance_by_depth", "accuracy", "speedup_estimate"}``.

    ``baseline``: the ``ar`` report on the same items (run here when None). ``done``: reports already
    measured for this mode, by gamma (reused, not rerun)."""
    if baseline is None:
        baseline = run_mode(reasoner, items, base.model_copy(update={"mode": "ar"}), progress)
    rows = []
    for g in gammas:
        rep = (done or {}).get(g)
        if rep is None:
            opts = with_overrides(base, mode=mode, gamma=g, max_gamma=max(base.max_gamma, g))
            rep = run_mode(reasoner, items, opts, progress)
        rows.append({"gamma": g, "tokens_per_s": rep.tokens_per_s,
                     "speedup_vs_ar": rep.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else None,
                     "acceptance_rate": rep.acceptance_rate, "acceptance_by_depth": rep.acceptance_by_depth,
                     "accuracy": rep.accuracy, "speedup_estimate": rep.estimate(baseline)})
    return rows


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
            "speedup_estimate": r.estimate(ar),
            "speedup_estimate_iid": r.estimate(ar, iid=True),
            "generated_tokens": r.tokens,
            "seconds": r.seconds,
            "judge_fallbacks": r.totals.fallbacks,
            "skipped_too_long": r.skipped,
            "turns": r.turns,
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


def plot_eval(docs: Sequence[dict], folder: str | Path) -> list[Path]:
    """PNG plots (matplotlib, Agg) from ``report_json`` documents, one panel per dataset:
    ``acceptance_by_depth.png`` (accepted / verified drafted steps at each depth, per speculative mode) and,
    when a document has a ``gamma_sweep``, ``speedup_vs_gamma.png`` (measured tokens/s speedup over ``ar``;
    dotted: the analytic estimate of :mod:`.metrics`). Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    fig, axes = plt.subplots(1, len(docs), figsize=(5 * len(docs), 4), squeeze=False)
    for ax, doc in zip(axes[0], docs):
        for i, (mode, row) in enumerate(doc["modes"].items()):
            acc = row.get("acceptance_by_depth") or []
            pts = [(d, a) for d, a in enumerate(acc) if a is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", color=f"C{i}", label=mode)
        ax.set(title=f"{doc['dataset']} (n={doc['n']})", xlabel="draft depth j (0 = first drafted step)",
               ylabel="step acceptance rate", ylim=(0, 1.05))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    out.append(folder / "acceptance_by_depth.png")
    fig.savefig(out[-1], dpi=120)
    plt.close(fig)
    sweeps = [d for d in docs if d.get("gamma_sweep")]
    if sweeps:
        fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4), squeeze=False)
        for ax, doc in zip(axes[0], sweeps):
            for i, (mode, rows) in enumerate(doc["gamma_sweep"].items()):
                g = [r["gamma"] for r in rows]
                ax.plot(g, [r["speedup_vs_ar"] for r in rows], "o-", color=f"C{i}", label=f"{mode} measured")
                est = [(r["gamma"], r["speedup_estimate"]) for r in rows if r.get("speedup_estimate") is not None]
                if est:
                    ax.plot(*zip(*est), ":", color=f"C{i}", label=f"{mode} estimate")
            ax.axhline(1.0, color="gray", linewidth=0.8)
            ax.set(title=doc["dataset"], xlabel="gamma (lookahead depth)", ylabel="speedup vs ar (tokens/s)")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
        fig.tight_layout()
        out.append(folder / "speedup_vs_gamma.png")
        fig.savefig(out[-1], dpi=120)
        plt.close(fig)
    return out


__all__ = ["ModeReport", "run_eval", "run_mode", "run_gamma_sweep", "uses_chat_template", "report_json",
           "write_json", "plot_eval", "load_items"]
