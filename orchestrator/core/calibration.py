"""Measure the speed model's cost ratios on the real engines (docs/design.md section 2).

``c`` is the draft's time per decoding step over the target's, ``b(n)`` the target's time per decoding step
with ``n`` sequences sharing a prefix (of lengths growing by 8 tokens, like a cycle's branches) over one
sequence; as in a cycle, only the shared prompt is cached (what a branch adds is new to the target), and the
prefill forwards are not counted in ``b`` where the engine times them (they are the speed model's ``Pi``).
Both are measured through the engine interface (so any backend can be calibrated): a warm prompt of
``prompt_tokens`` tokens, ``new_tokens`` greedy tokens, wall time divided by decoding steps (per-call overhead
amortised over the steps, as in a real step).

``v(w)``, the cost of one forward with ``w`` new positions per row (a token-level SD verification of
``w - 1`` proposals, or a prefill of ``w`` prompt tokens) relative to ``w = 1``, is read from the engine's own
per-forward timings where it keeps them (the portable engine's ``record_steps``): one sequence decodes with
n-gram SD of ``k`` proposals, and prompts of 8 to 64 uncached tokens are prefilled; the median time of
forwards of each width is divided by that of width-1 decoding steps. Engines without timings get ``v = 1``.

Rows and widths do not multiply: ``n`` branch rows each verifying n-gram proposals cost more than
``b(n) * v(w)`` (measured on the demo target: +6% at 3 rows, +13% at 5 rows, w = 3.5). So the branches of
``b(n)`` are also decoded with n-gram SD of each ``k`` in ``sd_ks`` (the repeated prompt text gives the n-gram
proposer matches), and the wall time per forward of the longest row at its mean padded width ``w`` gives
``cost(n, w)`` directly (``CostModel.row_width``); :meth:`CostModel.call_forward_cost` applies it as a
correction of ``b(n) * v(w)``.

Noise (see :func:`calibrate`): the measurements are interleaved across ``repeats`` rounds (each round times
one step of the target and the draft and then every ``n``), each ratio is taken within a round, and the
median over rounds is kept; the 1-minute load average at start and end is recorded in the model.
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..backends.base import Engine, GenerationRequest, SpecDecodeConfig


@dataclass
class CostModel:
    """Measured costs: seconds per decoding step at batch 1, ``b(n)`` ratios and the SD forward costs ``v(w)``
    of the target (``width``) and the draft (``draft_width``); ratios are dimensionless. ``load_avg_start`` /
    ``load_avg_end``: the 1-minute load average when :func:`calibrate` started and ended; ``repeats``: its
    rounds (all three None when not measured by it)."""

    target_step_seconds: float
    draft_step_seconds: float | None
    b: dict[int, float] = field(default_factory=dict)
    width: dict[int, float] = field(default_factory=dict)
    draft_width: dict[int, float] = field(default_factory=dict)
    row_width: dict[int, dict[float, float]] = field(default_factory=dict)
    load_avg_start: float | None = None  # 1-minute load average when calibration started / ended (None: unknown)
    load_avg_end: float | None = None
    repeats: int | None = None  # measurement rounds the ratios are medians over

    @property
    def c(self) -> float | None:
        if self.draft_step_seconds is None:
            return None
        return self.draft_step_seconds / self.target_step_seconds

    def b_of(self, n: float) -> float:
        """``b(n)``, linearly interpolated between measured ``n`` (1.0 at ``n <= 1``)."""
        return _interpolate(self.b, n)

    def forward_cost(self, positions: float, draft: bool = False) -> float:
        """``v(w)``: the cost of one forward with ``positions`` new positions per row relative to one position
        (the target's, or the draft's with ``draft``), interpolated, and extrapolated linearly beyond the
        widths measured (prefill forwards of a few dozen tokens)."""
        return _interpolate(self.draft_width if draft else self.width, max(positions, 1.0))

    def call_forward_cost(self, rows: float, positions: float) -> float:
        """The cost of one forward of ``rows`` rows with ``positions`` new positions each (padded), relative to
        one row and one position: ``b(rows) * v(positions)`` times the correction that ``row_width`` measured
        (measured / (b(n) v(w)) at its points; 1 at one position and one row, linear in between, held beyond
        the last point in each direction), so that measured points are reproduced and ``v``'s shape is kept."""
        w = max(positions, 1.0)
        base = self.b_of(rows) * self.forward_cost(w)
        if not self.row_width or rows <= 1:
            return base

        def correction(n: int) -> float:
            pts = {x: y / (self.b_of(n) * self.forward_cost(x)) for x, y in self.row_width[n].items()}
            return _interpolate(pts, min(w, max(pts)), start=(1.0, 1.0))

        per_rows = {n: correction(n) for n in self.row_width}
        return base * _interpolate(per_rows, min(rows, max(per_rows)), start=(1, 1.0))

    def to_dict(self) -> dict:
        ratios = lambda d: {str(k): v for k, v in sorted(d.items())}  # noqa: E731
        return {"target_step_ms": 1e3 * self.target_step_seconds,
                "draft_step_ms": None if self.draft_step_seconds is None else 1e3 * self.draft_step_seconds,
                "c": self.c, "b": ratios(self.b), "v": ratios(self.width), "draft_v": ratios(self.draft_width),
                "row_width": {str(n): {f"{w:.2f}": x for w, x in sorted(p.items())}
                              for n, p in sorted(self.row_width.items())},
                "repeats": self.repeats, "load_avg_1min_start": self.load_avg_start,
                "load_avg_1min_end": self.load_avg_end}


def _interpolate(points: dict, x: float, start: tuple[float, float] = (1, 1.0)) -> float:
    """Piecewise-linear through ``{start[0]: start[1], **points}``, extrapolated from the last two points and never
    downwards: a cost measured lower at the last point than at the one before is timing noise (a busy machine), and
    extended linearly it would reach zero or below far out (a 234-token prefill made a cycle's cost negative)."""
    pts = sorted({start[0]: start[1], **points}.items())
    if x <= pts[0][0] or len(pts) == 1:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + max(y1 - y0, 0.0) * (x - x1) / max(x1 - x0, 1)


def _step_seconds(engine: Engine, prompts: list[list[int]], new_tokens: int, repeats: int) -> float:
    """Best-of-``repeats`` wall time of one call generating ``new_tokens`` for each of ``prompts``, per token
    of its longest output."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = engine.generate([GenerationRequest(p, new_tokens) for p in prompts])
        steps = max(len(r.token_ids) for r in res)
        best = min(best, (time.perf_counter() - t0) / max(steps, 1))
    return best


@contextmanager
def _recording(engine: Engine):
    """The engine's per-forward timings (``step_seconds``, ``prefill_seconds``) recorded for the block, then
    switched off and cleared."""
    engine.record_steps, engine.step_seconds, engine.prefill_seconds = True, [], []
    try:
        yield engine
    finally:
        engine.record_steps, engine.step_seconds, engine.prefill_seconds = False, [], []


def _branch_call(engine: Engine, prompt: list[int], branches: list[list[int]], new_tokens: int, repeats: int,
                 spec: SpecDecodeConfig | None = None) -> tuple[float, float, float]:
    """Best-of-``repeats`` timing of one call over ``branches`` as a cycle makes it: only ``prompt`` is in the
    prefix cache (the drafted steps a branch adds are new to the target), and the time of the prefill forwards
    is left out where the engine records it (the speed model charges them as ``Pi``). Returns (seconds per
    output token of the longest row, seconds per decoding forward of that row, its mean padded width)."""
    best = (float("inf"), float("inf"), 1.0)
    timed = hasattr(engine, "record_steps") and hasattr(engine, "reset_prefix_cache")
    reqs = lambda: [GenerationRequest(b, new_tokens, spec=spec or SpecDecodeConfig()) for b in branches]  # noqa: E731
    for _ in range(repeats):
        if not timed:
            t0 = time.perf_counter()
            res = engine.generate(reqs())
            seconds = time.perf_counter() - t0
        else:
            engine.reset_prefix_cache()
            engine.generate([GenerationRequest(prompt, 1)])
            with _recording(engine):
                t0 = time.perf_counter()
                res = engine.generate(reqs())
                seconds = time.perf_counter() - t0 - sum(x for _, _, x in engine.prefill_seconds)
        longest = max(res, key=lambda r: (len(r.token_ids), r.counters.forward_passes))
        c = longest.counters
        forwards = c.forward_passes or len(longest.token_ids)
        width = c.forward_positions / c.forward_passes if c.forward_positions and c.forward_passes else 1.0
        if forwards and seconds / forwards < best[1]:
            best = (seconds / max(len(longest.token_ids), 1), seconds / forwards, width)
    return best


def _branches(prompt: list[int], n: int, step_tokens: int = 8) -> list[list[int]]:
    """``n`` prompts as a cycle's target branches: the prompt, then ``j`` more "steps" of ``step_tokens`` tokens
    (ragged rows, so the batched forwards need the attention mask a real cycle needs)."""
    ext = (list(prompt) * (n * step_tokens // max(len(prompt), 1) + 1))[: (n - 1) * step_tokens]
    return [list(prompt) + ext[: j * step_tokens] for j in range(n)]


def _width_costs(engine: Engine, prompt: list[int], ks=(1, 3, 6), prefills=(8, 16, 32, 64),
                 new_tokens: int = 48) -> dict[int, float]:
    """``v(w)`` from the engine's per-forward timings (see the module docstring); {} if it keeps none."""
    if not hasattr(engine, "record_steps"):
        return {}
    by_width: dict[int, list[float]] = {}
    with _recording(engine):
        for k in (0,) + tuple(ks):
            spec = SpecDecodeConfig(method="ngram", num_speculative_tokens=k) if k else SpecDecodeConfig()
            for _ in range(2):
                engine.generate([GenerationRequest(prompt, new_tokens, spec=spec)])
        for m in prefills:  # a prompt of m + 1 uncached tokens: one prefill forward of m positions
            for r in range(3):
                ids = (list(prompt) * (m // max(len(prompt), 1) + 2))[r:r + m + 1]
                engine.reset_prefix_cache()
                engine.generate([GenerationRequest(ids, 1)])
        for rows, width, seconds in engine.step_seconds + engine.prefill_seconds:
            if rows == 1:
                by_width.setdefault(width, []).append(seconds)
    if 1 not in by_width:
        return {}
    base = statistics.median(by_width[1])
    return {w: statistics.median(v) / base for w, v in sorted(by_width.items()) if w > 1 and len(v) >= 3}


def _load_average() -> float | None:
    """``os.getloadavg()[0]``, None where the OS has none."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


def calibrate(target: Engine, draft: Engine | None, ns=(2, 3, 4, 5, 6, 8), prompt_tokens: int = 200,
              new_tokens: int = 16, repeats: int = 5, text: str = "Step 1: 12 + 30 = 42 apples.\n\n",
              prompt_ids: list[int] | None = None, draft_prompt_ids: list[int] | None = None,
              sd_ks: tuple[int, ...] = (3, 6)) -> CostModel:
    """Measure :class:`CostModel` (a few seconds on the demo models on CPU).

    ``prompt_ids`` / ``draft_prompt_ids``: a representative prompt (e.g. the chat prompt of a dataset item) for
    the target and the draft. A step's time is the call's wall time over the tokens it made, so a prompt that
    the model ends after a few tokens (EOS) spreads the per-call overhead over too few: a real prompt avoids
    that. Without one, ``text`` repeated to ``prompt_tokens`` tokens is used.

    Robustness under load: ``repeats`` rounds, each measuring the target's single-sequence step ``t1``, the
    draft's ``d1`` and then every ``n`` once (interleaved: a burst of load from another process hits one round
    of every quantity, not all repeats of one ``n``). Each ratio (``b(n) = t(n) / t1``, ``d1 / t1``, the
    ``row_width`` costs) is taken within its round, where numerator and denominator are seconds apart under
    the same load, and the median over rounds is kept (``target_step_seconds``: the median ``t1``;
    ``draft_step_seconds``: that times the median ``d1 / t1``). Best-of-repeats (the minimum) would estimate an
    idle machine's costs from the luckiest samples, and a ratio of two minima taken at different times mixes
    load states; the median keeps the typical cost under the load the timed runs see and ignores spikes on
    either side. ``v(w)`` was already a median of per-forward timings. The 1-minute load average at start and
    end is stored in the model (``load_avg_start``/``load_avg_end``).

    Args:
        target, draft: engines (``draft`` None: no ``c``, no draft ``v``).
        ns: branch counts ``n`` of ``b(n)``; ``repeats``: rounds (>= 1); ``new_tokens``: tokens per timed call.
        sd_ks: n-gram proposal counts for the joint rows x widths costs.

    Returns:
        :class:`CostModel` (seconds and dimensionless ratios).

    Raises:
        ValueError: ``repeats < 1``.
    """
    if repeats < 1:
        raise ValueError(f"calibrate: repeats must be >= 1, got {repeats}")
    load_start = _load_average()

    def prompt_for(engine: Engine, given: list[int] | None) -> list[int]:
        if given:
            return list(given)
        ids = engine.encode(text)
        while len(ids) < prompt_tokens:
            ids = ids + ids
        return ids[:prompt_tokens]

    p = prompt_for(target, prompt_ids)
    pd = prompt_for(draft, draft_prompt_ids) if draft is not None else None
    _step_seconds(target, [p], 4, 1)  # warm the prefix cache and the allocator
    if draft is not None:
        _step_seconds(draft, [pd], 4, 1)
    branches = {n: _branches(p, n) for n in ns}
    specs = {k: SpecDecodeConfig(method="ngram", num_speculative_tokens=k) for k in sd_ks}
    t1s, c_ratios = [], []
    b_ratios: dict[int, list[float]] = {n: [] for n in ns}
    rw: dict[tuple[int, int], list[tuple[float, float]]] = {(n, k): [] for n in ns for k in sd_ks}
    for _ in range(repeats):  # one round: every quantity once, ratios within the round
        t1 = _step_seconds(target, [p], new_tokens, 1)
        t1s.append(t1)
        if draft is not None:
            c_ratios.append(_step_seconds(draft, [pd], new_tokens, 1) / t1)
        for n in ns:
            b_ratios[n].append(_branch_call(target, p, branches[n], new_tokens, 1)[0] / t1)
            for k in sd_ks:
                _, seconds, width = _branch_call(target, p, branches[n], new_tokens, 1, specs[k])
                rw[(n, k)].append((seconds / t1, width))
    t1 = statistics.median(t1s)
    b = {n: statistics.median(v) for n, v in b_ratios.items()}
    row_width: dict[int, dict[float, float]] = {}
    for (n, _k), vals in rw.items():
        mean_width = statistics.median(w for _, w in vals)
        if mean_width > 1.0:
            row_width.setdefault(n, {})[round(mean_width, 2)] = statistics.median(x for x, _ in vals)
    _step_seconds(target, [p], 1, 1)  # leave the prompt cached
    d1, dw = None, {}
    if draft is not None:
        d1 = statistics.median(c_ratios) * t1
        dw = _width_costs(draft, pd)
    width = _width_costs(target, p)
    return CostModel(t1, d1, b, width, dw, row_width, load_avg_start=load_start, load_avg_end=_load_average(),
                     repeats=repeats)


def calibrate_reasoner(reasoner, prompt: str | None = None, messages=None, ns=(2, 3, 4, 5, 6, 8)) -> CostModel:
    """:func:`calibrate` of a :class:`~lookahead_reasoning.core.lookahead.LookaheadReasoner`'s target and draft with
    the prompt of a representative request (``prompt`` or chat ``messages``) as each model sees it (chat
    template applied); the built-in text when neither is given."""
    if prompt is None and messages is None:
        return calibrate(reasoner.target, reasoner.draft, ns=ns)
    tp = reasoner.prompt_ids(reasoner.target, prompt, messages)
    dp = reasoner.prompt_ids(reasoner.draft, prompt, messages) if reasoner.draft is not None else None
    return calibrate(reasoner.target, reasoner.draft, ns=ns, prompt_ids=tp, draft_prompt_ids=dp)
