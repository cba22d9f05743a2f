"""Measure the speed model's cost ratios on the real engines (DESIGN.md section 1).

``c`` is the draft's time per decoding step over the target's, ``b(n)`` the target's time per decoding step
with ``n`` sequences sharing a prefix over one sequence. Both are measured through the engine interface
(so any backend can be calibrated): a warm prompt of ``prompt_tokens`` tokens, ``new_tokens`` greedy tokens,
wall time divided by decoding steps (per-call overhead amortised over the steps, as in a real step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .backends.base import Engine, GenerationRequest


@dataclass
class CostModel:
    """Measured costs: seconds per decoding step at batch 1 and ``b(n)`` ratios (dimensionless)."""

    target_step_seconds: float
    draft_step_seconds: float | None
    b: dict[int, float] = field(default_factory=dict)

    @property
    def c(self) -> float | None:
        if self.draft_step_seconds is None:
            return None
        return self.draft_step_seconds / self.target_step_seconds

    def b_of(self, n: float) -> float:
        """``b(n)``, linearly interpolated between measured ``n`` (1.0 at ``n <= 1``)."""
        pts = sorted({1: 1.0, **self.b}.items())
        if n <= pts[0][0]:
            return pts[0][1]
        for (n0, b0), (n1, b1) in zip(pts, pts[1:]):
            if n <= n1:
                return b0 + (b1 - b0) * (n - n0) / (n1 - n0)
        (n0, b0), (n1, b1) = pts[-2], pts[-1]
        return b1 + (b1 - b0) * (n - n1) / max(n1 - n0, 1)

    def to_dict(self) -> dict:
        return {"target_step_ms": 1e3 * self.target_step_seconds,
                "draft_step_ms": None if self.draft_step_seconds is None else 1e3 * self.draft_step_seconds,
                "c": self.c, "b": {str(k): v for k, v in sorted(self.b.items())}}


def _step_seconds(engine: Engine, prompt: list[int], n: int, new_tokens: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = engine.generate([GenerationRequest(prompt, new_tokens) for _ in range(n)])
        steps = max(len(r.token_ids) for r in res)
        best = min(best, (time.perf_counter() - t0) / max(steps, 1))
    return best


def calibrate(target: Engine, draft: Engine | None, ns=(2, 3, 4, 5, 6, 8), prompt_tokens: int = 200,
              new_tokens: int = 16, repeats: int = 3, text: str = "Step 1: 12 + 30 = 42 apples.\n\n") -> CostModel:
    """Measure :class:`CostModel` (a few seconds on the demo models on CPU)."""

    def prompt_for(engine: Engine) -> list[int]:
        ids = engine.encode(text)
        while len(ids) < prompt_tokens:
            ids = ids + ids
        return ids[:prompt_tokens]

    p = prompt_for(target)
    _step_seconds(target, p, 1, 4, 1)  # warm the prefix cache and the allocator
    t1 = _step_seconds(target, p, 1, new_tokens, repeats)
    b = {n: _step_seconds(target, p, n, new_tokens, repeats) / t1 for n in ns}
    d1 = None
    if draft is not None:
        pd = prompt_for(draft)
        _step_seconds(draft, pd, 1, 4, 1)
        d1 = _step_seconds(draft, pd, 1, new_tokens, repeats)
    return CostModel(t1, d1, b)
