"""Accuracy and speed evaluation of the modes on a dataset (the ``eval`` command).

Each mode runs every item sequentially (concurrency 1) on the same engines. Reported per mode: accuracy
(with its standard error ``sqrt(p (1 - p) / n)``), output tokens/s (total generated tokens / total seconds),
``speedup_vs_ar`` (that throughput over ``ar``'s), step acceptance rate (accepted / verified drafted steps,
also per depth), and for speculative modes the analytic estimate of :mod:`..core.metrics` computed with the run's
own acceptance and a calibrated cost model.

Prompts: an item's chat form (the paper's math instruction, the HumanEval instruction) is used when the
target has a chat template (the same test as :meth:`LookaheadReasoner.prompt_ids`), else its plain form.
MT-Bench items are two-turn chats: turn 2 is asked after the model's own turn-1 answer; speed counts both
turns. Items whose prompt does not fit the target's context window are skipped and counted.

Gamma sweep (:func:`run_gamma_sweep`): one speculative mode at several lookahead depths; speedup at each is
that run's output tokens/s over the ``ar`` run's on the same items.

How speed is measured (:func:`run_interleaved`, used by :func:`run_eval` and the sweep): first one untimed
warm-up request per mode (on a spare item when the caller has one), then the modes interleaved per item with
a rotated order (item ``i`` starts at mode ``i mod len(modes)``, so each mode goes first equally often and
slow drifts of the machine's load hit all modes alike); the engines' prefix caches are cleared before each
timed item, so no mode finds the prompt cached by the mode run just before it. The spread of
``speedup_vs_ar`` is a paired bootstrap over items (:func:`bootstrap_speedup_ci`): items are resampled with
replacement, the same indices for the mode and ``ar``, and the ratio of summed tokens over summed seconds is
taken for each; :func:`measurement_block` records all this, with the machine's load, in the JSON.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.lookahead import LookaheadReasoner, LROptions, with_overrides
from ..core.metrics import RequestMetrics
from ..core.steps import split_steps
from .answers import EvalItem, check_answer, load_items

#: Bootstrap resamples and seed of :func:`bootstrap_speedup_ci` (fixed, so a report is reproducible).
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
#: Untimed warm-up requests per mode before the timed ones (``eval``, ``lr_bench``, ``bench``).
WARMUP_REQUESTS = 1
#: The order :func:`run_interleaved` runs modes in, as the JSON's ``measurement.order`` says it.
INTERLEAVED_ORDER = "interleaved per item, rotated"
#: What :func:`run_interleaved` does with the engines' prefix caches, as ``measurement.prefix_cache`` says it.
PREFIX_CACHE_NOTE = "cleared before each timed item (engines with reset_prefix_cache)"
#: A 1-minute load average above this many runnable processes per core at the start gets a warning.
LOAD_WARN_PER_CORE = 0.5


@dataclass
class ModeReport:
    """One mode over a dataset: accuracy counts, and ``totals``, every request's :class:`RequestMetrics`
    merged (so rates and the speed-model estimate come from the run's totals, not averages of ratios).

    ``per_item``: one ``(item index, generated tokens, seconds)`` per measured (not skipped) item, all its
    turns summed; the index is the item's position in the sequence the run was given, so two runs on the same
    items pair up by it (:meth:`speedup_ci`)."""

    mode: str
    n: int = 0
    correct: int = 0
    graded: int = 0
    skipped: int = 0
    turns: int = 0
    outputs: list[dict] = field(default_factory=list)
    totals: RequestMetrics = field(default_factory=RequestMetrics)
    cost_model: object = None  # the calibration.CostModel the run was estimated with, if any
    per_item: list[tuple[int, int, float]] = field(default_factory=list)
    delimiter: str = "\n\n"  # the step delimiter answers are split by (steps_per_answer)
    reasoning_parser: str = "qwen3"  # how the final answer is told from the reasoning when grading
    answer_steps: int = 0  # steps in the graded (last-turn) answers, summed
    item_correct: dict[int, bool] = field(default_factory=dict)  # item index -> graded correct (graded items only)

    @property
    def steps_per_answer(self) -> float | None:
        """Mean steps per answer (:func:`~lookahead_reasoning.core.steps.split_steps` of each item's last turn)."""
        return self.answer_steps / self.n if self.n else None

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
        return [a / v if v else None for a, v in zip(t.accepted_by_depth, t.verified_by_depth, strict=False)]

    def estimate(self, ar: ModeReport | None = None, **kw) -> float | None:
        """The speed model's prediction of ``speedup_vs_ar``: equation (1) of :mod:`..core.metrics` on this run's totals
        divided by equation (1)
        for ``ar``, the ``ar`` run on the same items (both charge the prompts' prefill, so an ``ar`` run is
        exactly 1.0); the undivided estimate without ``ar``. ``kw``: ``iid`` or ``free_draft_and_judge`` of
        :meth:`..core.metrics.RequestMetrics.estimate` for this run."""
        est = self.totals.estimate(self.cost_model, **kw)
        base = ar.totals.estimate(ar.cost_model) if ar is not None else None
        return est / base if est is not None and base else est

    def speedup_vs(self, ar: ModeReport | None) -> float | None:
        """This run's output tokens/s over ``ar``'s (dimensionless); None without ``ar`` or if it made none."""
        return self.tokens_per_s / ar.tokens_per_s if ar is not None and ar.tokens_per_s else None

    def solved_changes(self, ar: ModeReport | None) -> dict[str, int] | None:
        """``{"lost", "gained"}``: items graded in both runs that ``ar`` answered correctly and this run did not, and
        the reverse (paired by item index); None without ``ar``."""
        if ar is None:
            return None
        both = [(ok, ar.item_correct[i]) for i, ok in self.item_correct.items() if i in ar.item_correct]
        return {"lost": sum(theirs and not ok for ok, theirs in both),
                "gained": sum(ok and not theirs for ok, theirs in both)}

    def per_item_json(self) -> dict[str, list]:
        """``{"index", "generated_tokens", "seconds", "correct"}``: lists, one entry per measured item (``correct``
        None where the item was not graded)."""
        return {"index": [i for i, _, _ in self.per_item], "generated_tokens": [t for _, t, _ in self.per_item],
                "seconds": [s for _, _, s in self.per_item],
                "correct": [self.item_correct.get(i) for i, _, _ in self.per_item]}

    def speedup_ci(self, ar: ModeReport | None, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                   level: float = 0.95) -> list[float] | None:
        """``[lo, hi]``, the ``level`` paired-bootstrap interval of :meth:`speedup_vs` over the items both runs
        measured (paired by item index, see :func:`bootstrap_speedup_ci`); None without ``ar`` or shared
        items."""
        if ar is None:
            return None
        theirs = {i: (t, s) for i, t, s in ar.per_item}
        pairs = [(t, s, *theirs[i]) for i, t, s in self.per_item if i in theirs]
        if not pairs:
            return None
        tok, sec, ar_tok, ar_sec = (np.asarray(x, dtype=float) for x in zip(*pairs, strict=False))
        return bootstrap_speedup_ci(tok, sec, ar_tok, ar_sec, resamples=resamples, seed=seed, level=level)


def bootstrap_speedup_ci(tokens, seconds, ar_tokens, ar_seconds, resamples: int = BOOTSTRAP_RESAMPLES,
                         seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> list[float] | None:
    """Paired percentile-bootstrap interval of the speedup ``(sum tokens / sum seconds) / (sum ar_tokens /
    sum ar_seconds)``.

    Args:
        tokens, seconds: per item, the mode's generated tokens and wall seconds (1-D, length ``n``).
        ar_tokens, ar_seconds: the same for ``ar``; element ``k`` of every array is the same item.
        resamples: bootstrap resamples (each draws ``n`` item indices with replacement, the same indices for
            the mode and ``ar``); ``seed``: of ``numpy.random.default_rng``.
        level: the interval's coverage (0.95: the 2.5th and 97.5th percentiles of the resampled ratios).

    Returns:
        ``[lo, hi]`` (dimensionless), or None when ``n == 0`` or no resample has a finite ratio.

    Raises:
        ValueError: arrays of different lengths or not 1-D, ``resamples < 1``, ``level`` not in (0, 1).
    """
    arrays = [np.asarray(x, dtype=float) for x in (tokens, seconds, ar_tokens, ar_seconds)]
    if any(a.ndim != 1 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise ValueError("bootstrap_speedup_ci: tokens, seconds, ar_tokens and ar_seconds must be 1-D, equally long")
    if resamples < 1:
        raise ValueError(f"bootstrap_speedup_ci: resamples must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"bootstrap_speedup_ci: level must be in (0, 1), got {level}")
    n = arrays[0].shape[0]
    if n == 0:
        return None
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    tok, sec, ar_tok, ar_sec = (a[idx].sum(axis=1) for a in arrays)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (tok / sec) / (ar_tok / ar_sec)
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size == 0:
        return None
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(ratio, [tail, 100 - tail])
    return [float(lo), float(hi)]


def load_average() -> float | None:
    """The 1-minute load average (``os.getloadavg()[0]``: runnable processes, averaged); None where the OS
    has none."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


def load_warning(load: float | None, cpus: int | None = None) -> str | None:
    """A one-line warning when ``load`` (a 1-minute load average taken before the run) is above
    :data:`LOAD_WARN_PER_CORE` per core of ``cpus`` (default ``os.cpu_count()``); else None."""
    cpus = cpus or os.cpu_count() or 1
    if load is None or load <= LOAD_WARN_PER_CORE * cpus:
        return None
    return (f"the 1-minute load average was {load:.2f} at the start on {cpus} cores (> {LOAD_WARN_PER_CORE} per "
            f"core): other processes were competing for the CPU, so the speeds and speedups are noisy")


def measurement_block(load_start: float | None, **fields) -> dict:
    """The JSON's ``measurement`` object: ``fields`` (e.g. ``warmup_requests_per_mode``, ``order``,
    ``bootstrap_resamples``), then ``load_avg_1min_start`` (``load_start``, taken before the run),
    ``load_avg_1min_end`` (taken now; it includes the run's own load), ``cpu_count`` and, when
    :func:`load_warning` finds the start load too high, ``warning``."""
    cpus = os.cpu_count() or 1
    doc = {**fields, "load_avg_1min_start": load_start, "load_avg_1min_end": load_average(), "cpu_count": cpus}
    warning = load_warning(load_start, cpus)
    if warning:
        doc["warning"] = warning
    return doc


def format_speedup(x: float | None, ci: Sequence[float] | None = None) -> str:
    """``"1.23 [1.10, 1.35]"`` (the interval when given), ``"n/a"`` for None."""
    if x is None:
        return "n/a"
    return f"{x:.2f}" if not ci else f"{x:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


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


def _record(rep: ModeReport, index: int, item: EvalItem, results: list, keep_outputs: bool) -> None:
    """Add one item's turns (``results``; empty: skipped as too long) to ``rep``; grades the last turn."""
    if not results:
        rep.skipped += 1
        return
    for res in results:
        rep.turns += 1
        rep.totals.merge(res.metrics)
    rep.per_item.append((index, sum(r.metrics.generated_tokens for r in results),
                         sum(r.metrics.seconds for r in results)))
    rep.n += 1
    rep.answer_steps += len(split_steps(results[-1].text, rep.delimiter))
    ok = check_answer(item, results[-1].text, rep.reasoning_parser)
    if ok is not None:
        rep.graded += 1
        rep.correct += int(ok)
        rep.item_correct[index] = bool(ok)
    if keep_outputs:
        texts = [r.text for r in results]
        rep.outputs.append({"id": item.id, "text": texts if item.turns else texts[0], "correct": ok})


def _try_item(reasoner: LookaheadReasoner, item: EvalItem, opts: LROptions, chat: bool) -> list:
    """:func:`_run_item`, or ``[]`` when the prompt does not fit the target's context window."""
    try:
        return _run_item(reasoner, item, opts, chat)
    except ValueError as exc:
        if not _too_long(exc):
            raise
        return []


def _clear_prefix_caches(reasoner: LookaheadReasoner) -> None:
    """Empty the prefix cache of each of the reasoner's engines that has one (``reset_prefix_cache``)."""
    engines = {id(e): e for e in (reasoner.target, reasoner.draft, getattr(reasoner, "judge_engine", None))
               if e is not None}
    for engine in engines.values():
        reset = getattr(engine, "reset_prefix_cache", None)
        if callable(reset):
            reset()


def run_interleaved(reasoner: LookaheadReasoner, items: Sequence[EvalItem], runs: Mapping[str, LROptions],
                    progress: Callable | None = None, keep_outputs: bool = False, warmup: int = 1,
                    warmup_item: EvalItem | None = None) -> dict[str, ModeReport]:
    """Every item under every named option set of ``runs``, interleaved per item with a rotated order.

    First ``warmup`` untimed requests per run on ``warmup_item`` (default: the first item, which is still
    measured afterwards; their results are discarded, not counted anywhere). Then for item ``i`` the runs go
    in ``runs`` order starting at position ``i mod len(runs)``, so each run goes first equally often; the
    engines' prefix caches are emptied before each timed item (see the module docstring). ``progress()`` is
    called after each timed item of each run.

    Returns:
        ``{name: ModeReport}`` in ``runs`` order (a report's ``mode`` is its options' ``mode``).

    Raises:
        ValueError: ``warmup < 0``; any error of :meth:`LookaheadReasoner.run` except a too-long prompt
        (counted in ``skipped``).
    """
    if warmup < 0:
        raise ValueError(f"warmup: must be >= 0, got {warmup}")
    chat = uses_chat_template(reasoner)
    names = list(runs)
    reports = {name: ModeReport(opts.mode, cost_model=reasoner.cost_model, delimiter=opts.step.delimiter,
                                reasoning_parser=reasoner.reasoning_parser)
               for name, opts in runs.items()}
    spare = warmup_item if warmup_item is not None else (items[0] if items else None)
    if spare is not None:
        for _ in range(warmup):
            for name in names:
                _try_item(reasoner, spare, runs[name], chat)
    for i, item in enumerate(items):
        k = i % len(names) if names else 0
        for name in names[k:] + names[:k]:
            _clear_prefix_caches(reasoner)
            _record(reports[name], i, item, _try_item(reasoner, item, runs[name], chat), keep_outputs)
            if progress:
                progress()
    return reports


def run_mode(reasoner: LookaheadReasoner, items: Sequence[EvalItem], opts: LROptions,
             progress: Callable | None = None, keep_outputs: bool = False, warmup: int = 0,
             warmup_item: EvalItem | None = None) -> ModeReport:
    """Every item in one mode (``opts.mode``); grades the last turn's text. For a single mode; to compare
    modes use :func:`run_eval` (interleaved). ``warmup``/``warmup_item``: as :func:`run_interleaved` (no
    warm-up by default)."""
    return run_interleaved(reasoner, items, {opts.mode: opts}, progress, keep_outputs, warmup, warmup_item)[opts.mode]


def run_eval(reasoner: LookaheadReasoner, items: Sequence[EvalItem], modes: Sequence[str],
             base: LROptions, progress: Callable | None = None, keep_outputs: bool = False, warmup: int = 1,
             warmup_item: EvalItem | None = None) -> dict[str, ModeReport]:
    """Run every item in every mode, interleaved per item with a rotated order after ``warmup`` untimed
    requests per mode (:func:`run_interleaved`); returns a :class:`ModeReport` per mode (in ``modes`` order)."""
    return run_interleaved(reasoner, items, {mode: base.model_copy(update={"mode": mode}) for mode in modes},
                           progress, keep_outputs, warmup, warmup_item)


def sweep_options(base: LROptions, mode: str, gamma: int) -> LROptions:
    """``base`` in ``mode`` at lookahead depth ``gamma`` (``max_gamma`` raised to it when lower)."""
    return with_overrides(base, mode=mode, gamma=gamma, max_gamma=max(base.max_gamma, gamma))


def gamma_row(gamma: int, rep: ModeReport, baseline: ModeReport) -> dict:
    """One row of :func:`run_gamma_sweep` for the report ``rep`` measured at ``gamma``."""
    return {"gamma": gamma, "tokens_per_s": rep.tokens_per_s, "speedup_vs_ar": rep.speedup_vs(baseline),
            "speedup_vs_ar_ci95": rep.speedup_ci(baseline),
            "acceptance_rate": rep.acceptance_rate, "acceptance_by_depth": rep.acceptance_by_depth,
            "accuracy": rep.accuracy, "speedup_estimate": rep.estimate(baseline)}


def run_gamma_sweep(reasoner: LookaheadReasoner, items: Sequence[EvalItem], mode: str, gammas: Sequence[int],
                    base: LROptions, baseline: ModeReport | None = None, done: dict[int, ModeReport] | None = None,
                    progress: Callable | None = None, warmup: int = 1,
                    warmup_item: EvalItem | None = None) -> list[dict]:
    """``mode`` at each gamma in ``gammas``; returns one row per gamma: ``{"gamma", "tokens_per_s",
    "speedup_vs_ar", "speedup_vs_ar_ci95", "acceptance_rate", "acceptance_by_depth", "accuracy",
    "speedup_estimate"}``.

    ``baseline``: the ``ar`` report on the same items; when None, ``ar`` is run here, interleaved per item
    with the gammas still to measure (:func:`run_interleaved`, after ``warmup`` requests each). ``done``:
    reports already measured for this mode, by gamma (reused, not rerun); to have every gamma interleaved with
    ``ar``, measure them all in one :func:`run_interleaved` (as the ``eval`` command does) and pass them here."""
    todo = {g: sweep_options(base, mode, g) for g in gammas if (done or {}).get(g) is None}
    runs = ({} if baseline is not None else {"ar": base.model_copy(update={"mode": "ar"})})
    runs.update({f"gamma={g}": opts for g, opts in todo.items()})
    measured = run_interleaved(reasoner, items, runs, progress, warmup=warmup, warmup_item=warmup_item) if runs else {}
    baseline = baseline if baseline is not None else measured["ar"]
    reps = {**(done or {}), **{g: measured[f"gamma={g}"] for g in todo}}
    return [gamma_row(g, reps[g], baseline) for g in gammas]


def report_json(dataset: str, reports: dict[str, ModeReport], extra: dict | None = None) -> dict:
    """The ``--out`` document: ``{"dataset", "n", "modes": {MODE: {...}}}`` plus ``extra``. Per mode, among
    others: ``speedup_vs_ar`` (tokens/s over ``ar``'s), ``speedup_vs_ar_ci95`` (``[lo, hi]``,
    :meth:`ModeReport.speedup_ci`), ``solved_vs_ar`` (:meth:`ModeReport.solved_changes`) and ``per_item``
    (:meth:`ModeReport.per_item_json`)."""
    ar = reports.get("ar")
    modes = {}
    for mode, r in reports.items():
        t = r.totals
        modes[mode] = {
            "accuracy": r.accuracy,
            "accuracy_stderr": r.accuracy_stderr,
            "tokens_per_s": r.tokens_per_s,
            "speedup_vs_ar": r.speedup_vs(ar),
            "speedup_vs_ar_ci95": r.speedup_ci(ar),
            "latency_speedup_vs_ar": (ar.seconds / r.seconds) if ar and r.seconds else None,
            "acceptance_rate": r.acceptance_rate,
            "acceptance_by_depth": r.acceptance_by_depth,
            "verified_by_depth": list(r.totals.verified_by_depth),
            "steps_per_cycle": (t.steps / t.cycles) if t.cycles else None,
            "target_tokens_per_forward": (t.target.call_tokens / t.target.forward_passes
                                          if t.target.forward_passes else None),
            "time_share": ({"draft": t.draft.seconds / r.seconds, "target": t.target.seconds / r.seconds,
                            "judge": t.judge_seconds / r.seconds} if r.seconds else None),
            "steps_per_answer": r.steps_per_answer,
            "speedup_estimate": r.estimate(ar),
            "speedup_estimate_iid": r.estimate(ar, iid=True),
            "generated_tokens": r.tokens,
            "seconds": r.seconds,
            "judge_fallbacks": r.totals.fallbacks,
            "skipped_too_long": r.skipped,
            "turns": r.turns,
            "solved_vs_ar": r.solved_changes(ar),
            "per_item": r.per_item_json(),
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
    ``acceptance_by_depth.png`` (accepted / verified drafted steps at each depth, per speculative mode, with
    the binomial standard error ``sqrt(p (1 - p) / n)`` over the ``n`` steps verified at that depth) and, when a
    document has a ``gamma_sweep``, ``speedup_vs_gamma.png`` (measured tokens/s speedup over ``ar`` with its 95%
    paired-bootstrap interval; dotted: the analytic estimate of :mod:`..core.metrics`). A mode keeps its colour, line
    style and marker in every plot (:data:`..reporting.MODE_STYLE`); depth and gamma axes tick at integers.
    Returns the written paths."""
    from matplotlib.ticker import MaxNLocator

    from ..reporting import mode_style, pyplot

    plt = pyplot()

    def finish(ax, **labels) -> None:  # integer x ticks, grid, legend
        ax.set(**labels)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    fig, axes = plt.subplots(1, len(docs), figsize=(5 * len(docs), 4), squeeze=False)
    for ax, doc in zip(axes[0], docs, strict=False):
        for mode, row in doc["modes"].items():
            acc = row.get("acceptance_by_depth") or []
            n = row.get("verified_by_depth") or [0] * len(acc)
            pts = [(d, a, (a * (1 - a) / n[d]) ** 0.5 if n[d] else 0.0) for d, a in enumerate(acc) if a is not None]
            if pts:
                colour, line, marker = mode_style(mode)
                d, a, err = zip(*pts, strict=False)
                ax.errorbar(d, a, yerr=err, color=colour, linestyle=line, marker=marker, capsize=3, label=mode)
        finish(ax, title=f"{doc['dataset']} (n={doc['n']})", xlabel="draft depth j (0 = first drafted step)",
               ylabel="step acceptance rate", ylim=(0, 1.05))
    fig.tight_layout()
    out.append(folder / "acceptance_by_depth.png")
    fig.savefig(out[-1], dpi=120)
    plt.close(fig)
    sweeps = [d for d in docs if d.get("gamma_sweep")]
    if sweeps:
        fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4), squeeze=False)
        for ax, doc in zip(axes[0], sweeps, strict=False):
            for mode, rows in doc["gamma_sweep"].items():
                colour, line, marker = mode_style(mode)
                g = [r["gamma"] for r in rows]
                y = [r["speedup_vs_ar"] for r in rows]
                cis = [r.get("speedup_vs_ar_ci95") or [v, v] for r, v in zip(rows, y, strict=False)]
                err = [[v - lo for v, (lo, _) in zip(y, cis, strict=False)],
                       [hi - v for v, (_, hi) in zip(y, cis, strict=False)]]
                ax.errorbar(g, y, yerr=err, color=colour, linestyle=line, marker=marker, capsize=3,
                            label=f"{mode} measured (95% CI)")
                est = [(r["gamma"], r["speedup_estimate"]) for r in rows if r.get("speedup_estimate") is not None]
                if est:
                    ax.plot(*zip(*est, strict=False), ":", color=colour, marker=marker, fillstyle="none",
                            label=f"{mode} estimate")
            ax.axhline(1.0, color="gray", linewidth=0.8)
            finish(ax, title=doc["dataset"], xlabel="gamma (lookahead depth)", ylabel="speedup vs ar (tokens/s)")
        fig.tight_layout()
        out.append(folder / "speedup_vs_gamma.png")
        fig.savefig(out[-1], dpi=120)
        plt.close(fig)
    return out


def load_with_spare(dataset: str, limit: int | None) -> tuple[list[EvalItem], EvalItem | None]:
    """The first ``limit`` items of ``dataset`` (all without ``limit``) and a spare item for the warm-up, the
    one after them, not measured (None when the dataset has no more items, or without ``limit``: the warm-up
    then reuses the first measured item). Raises what :func:`load_items` raises."""
    items = load_items(dataset, None if limit is None else limit + 1)
    if limit is not None and len(items) > limit:
        return items[:limit], items[limit]
    return items, None


__all__ = ["ModeReport", "run_eval", "run_interleaved", "run_mode", "run_gamma_sweep", "gamma_row", "sweep_options",
           "bootstrap_speedup_ci", "load_average", "load_warning", "measurement_block", "format_speedup",
           "load_with_spare", "uses_chat_template", "report_json", "write_json", "plot_eval", "load_items"]
