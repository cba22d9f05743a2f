"""Measure the speed model's cost ratios on the real engines (DESIGN.md section 1).

``c`` is the draft's time per decoding step over the target's, ``b(n)`` the target's time per decoding step
with ``n`` sequences sharing a prefix (of lengths growing by 8 tokens, like a cycle's branches) over one
sequence. Both are measured through the engine interface
(so any backend can be calibrated): a warm prompt of ``prompt_tokens`` tokens, ``new_tokens`` greedy tokens,
wall time divided by decoding steps (per-call overhead amortised over the steps, as in a real step).

``v(w)``, the cost of one forward with ``w`` new positions per row (a token-level SD verification of
``w - 1`` proposals, or a prefill of ``w`` prompt tokens) relative to ``w = 1``, is read from the engine's own
per-forward timings where it keeps them (the portable engine's ``record_steps``): one sequence decodes with
n-gram SD of ``k`` proposals, and prompts of 8 to 64 uncached tokens are prefilled; the median time of
forwards of each width is divided by that of width-1 decoding steps. Engines without timings get ``v = 1``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from .backends.base import Engine, GenerationRequest, SpecDecodeConfig


@dataclass
class CostModel:
    """Measured costs: seconds per decoding step at batch 1, ``b(n)`` ratios and the SD forward costs ``v(w)``
    of the target (``width``) and the draft (``draft_width``); ratios are dimensionless."""

    target_step_seconds: float
    draft_step_seconds: float | None
    b: dict[int, float] = field(default_factory=dict)
    width: dict[int, float] = field(default_factory=dict)
    draft_width: dict[int, float] = field(default_factory=dict)

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

    def to_dict(self) -> dict:
        ratios = lambda d: {str(k): v for k, v in sorted(d.items())}  # noqa: E731
        return {"target_step_ms": 1e3 * self.target_step_seconds,
                "draft_step_ms": None if self.draft_step_seconds is None else 1e3 * self.draft_step_seconds,
                "c": self.c, "b": ratios(self.b), "v": ratios(self.width), "draft_v": ratios(self.draft_width)}


def _interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through ``{1: 1.0, **points}``, extrapolated from the last two points."""
    pts = sorted({1: 1.0, **points}.items())
    if x <= pts[0][0] or len(pts) == 1:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) * (x - x1) / max(x1 - x0, 1)


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
    engine.record_steps, engine.step_seconds, engine.prefill_seconds = True, [], []
    try:
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
    finally:
        engine.record_steps, engine.step_seconds, engine.prefill_seconds = False, [], []
    if 1 not in by_width:
        return {}
    base = statistics.median(by_width[1])
    return {w: statistics.median(v) / base for w, v in sorted(by_width.items()) if w > 1 and len(v) >= 3}


def calibrate(target: Engine, draft: Engine | None, ns=(2, 3, 4, 5, 6, 8), prompt_tokens: int = 200,
              new_tokens: int = 16, repeats: int = 3, text: str = "Step 1: 12 + 30 = 42 apples.\n\n",
              prompt_ids: list[int] | None = None, draft_prompt_ids: list[int] | None = None) -> CostModel:
    """Measure :class:`CostModel` (a few seconds on the demo models on CPU).

    ``prompt_ids`` / ``draft_prompt_ids``: a representative prompt (e.g. the chat prompt of a dataset item) for
    the target and the draft. A step's time is the call's wall time over the tokens it made, so a prompt that
    the model ends after a few tokens (EOS) spreads the per-call overhead over too few: a real prompt avoids
    that. Without one, ``text`` repeated to ``prompt_tokens`` tokens is used.
    """

    def prompt_for(engine: Engine, given: list[int] | None) -> list[int]:
        if given:
            return list(given)
        ids = engine.encode(text)
        while len(ids) < prompt_tokens:
            ids = ids + ids
        return ids[:prompt_tokens]

    p = prompt_for(target, prompt_ids)
    _step_seconds(target, [p], 4, 1)  # warm the prefix cache and the allocator
    t1 = _step_seconds(target, [p], new_tokens, repeats)
    b = {}
    for n in ns:
        branches = _branches(p, n)
        _step_seconds(target, branches, 1, 1)  # the branches' prompts into the prefix cache
        b[n] = _step_seconds(target, branches, new_tokens, repeats) / t1
    d1, dw = None, {}
    if draft is not None:
        pd = prompt_for(draft, draft_prompt_ids)
        _step_seconds(draft, [pd], 4, 1)
        d1 = _step_seconds(draft, [pd], new_tokens, repeats)
        dw = _width_costs(draft, pd)
    return CostModel(t1, d1, b, _width_costs(target, p), dw)


def calibrate_reasoner(reasoner, prompt: str | None = None, messages=None, ns=(2, 3, 4, 5, 6, 8)) -> CostModel:
    """:func:`calibrate` of a :class:`~lookahead_reasoning.lookahead.LookaheadReasoner`'s target and draft with
    the prompt of a representative request (``prompt`` or chat ``messages``) as each model sees it (chat
    template applied); the built-in text when neither is given."""
    if prompt is None and messages is None:
        return calibrate(reasoner.target, reasoner.draft, ns=ns)
    tp = reasoner.prompt_ids(reasoner.target, prompt, messages)
    dp = reasoner.prompt_ids(reasoner.draft, prompt, messages) if reasoner.draft is not None else None
    return calibrate(reasoner.target, reasoner.draft, ns=ns, prompt_ids=tp, draft_prompt_ids=dp)
