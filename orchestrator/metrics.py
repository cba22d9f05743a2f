"""Per-request metrics and the analytic speed model of Lookahead Reasoning.

Speed model (DESIGN.md section 1; paper arXiv 2506.19830, section 3, synchronous case). Let ``alpha`` be the
probability that a drafted step is accepted, independently per step, ``gamma`` the lookahead depth, ``c`` the
cost of one draft step relative to one target step, ``b(n)`` the cost of one target call with ``n`` parallel
branches relative to one branch, and ``j`` the judge's cost per cycle relative to one target step.

A synchronous cycle yields ``E[steps] = sum_{i=0..gamma} alpha^i = (1 - alpha^(gamma+1)) / (1 - alpha)``
steps (``gamma + 1`` when ``alpha = 1``): the accepted prefix of drafts plus one target step. It costs
``gamma * c + b(gamma + 1) + j`` target-step times, while autoregressive decoding costs 1 per step, so

    speedup_LR = E[steps] / (gamma * c + b(gamma + 1) + j)                                  (1)

With token-level speculative decoding inside target steps, each target call also runs
``s = tokens / forward passes`` times fewer forwards; we multiply (1) by the measured ``s`` of the run
relative to the autoregressive baseline's (1 for plain decoding), treating a verification forward as costing
one decoding forward (true within ~10% for the small models on CPU; see ``benchmarks/RESULTS.md``):

    speedup_LR+SD = speedup_LR * s                                                          (2)

``gamma = 0`` gives ``E[steps] = 1`` and cost ``b(1) = 1``: plain decoding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def expected_steps_per_cycle(alpha: float, gamma: int) -> float:
    """``sum_{i=0..gamma} alpha^i`` (equation (1)'s numerator); ``alpha`` in [0, 1], ``gamma >= 0``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma: must be >= 0, got {gamma}")
    return float(sum(alpha**i for i in range(gamma + 1)))


def estimate_speedup(alpha: float, gamma: int, c: float, b: float, judge: float = 0.0, sd_factor: float = 1.0) -> float:
    """Analytic speedup over autoregressive decoding, equations (1) and (2) of this module.

    Args:
        alpha: step acceptance probability in [0, 1].
        gamma: lookahead depth (>= 0).
        c: draft step cost / target step cost.
        b: cost of one target call with ``gamma + 1`` branches relative to one branch (``b(gamma+1)``).
        judge: judge cost per cycle in target-step units.
        sd_factor: tokens per target forward with SD divided by the same for the baseline (1 without SD).
    Returns:
        the estimated speedup (float, > 0).
    """
    cost = gamma * c + b + judge
    if cost <= 0:
        raise ValueError("cycle cost must be > 0")
    return expected_steps_per_cycle(alpha, gamma) / cost * sd_factor


@dataclass
class RequestMetrics:
    """What one request did. Times are wall-clock seconds; token counts are target-tokenizer tokens.

    In asynchronous mode the role times overlap, so they can sum to more than ``seconds``.
    """

    mode: str = "lr+sd"
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    ttft_seconds: float | None = None
    cycles: int = 0
    steps: int = 0
    target_steps: int = 0
    drafted_steps: int = 0
    verified_steps: int = 0
    accepted_steps: int = 0
    accepted_by_depth: list[int] = field(default_factory=list)
    verified_by_depth: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    judge_seconds: float = 0.0
    draft_tokens: int = 0
    target_tokens: int = 0
    target_forward_passes: int = 0
    target_branches: int = 0
    target_call_tokens: int = 0
    target_drafted_tokens: int = 0
    target_accepted_tokens: int = 0
    fallbacks: int = 0
    draft_failures: int = 0
    gamma_sum: int = 0
    speedup_estimate: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / verified drafted steps; None when nothing was verified (``ar``, ``sd``)."""
        return self.accepted_steps / self.verified_steps if self.verified_steps else None

    @property
    def mean_gamma(self) -> float:
        return self.gamma_sum / self.cycles if self.cycles else 0.0

    @property
    def sd_tokens_per_forward(self) -> float:
        """Tokens per forward pass in the target's calls, per branch (1.0 without token-level SD)."""
        f = self.target_forward_passes
        return (self.target_call_tokens / f) if f else 1.0

    def estimate(self, cost) -> float | None:
        """Equations (1)-(2) with this request's acceptance, mean gamma, judge time and SD factor, and the
        calibrated ``c`` and ``b(gamma + 1)`` of ``cost`` (a :class:`~lookahead_reasoning.calibration.CostModel`).
        The judge's time is expressed in target steps of this request's mean target-step length."""
        if cost is None or self.target_branches == 0:
            return None
        sd = self.sd_tokens_per_forward
        gamma = self.mean_gamma
        if gamma == 0 or cost.c is None:
            return sd
        tokens_per_step = self.target_call_tokens / self.target_branches
        step_seconds = max(tokens_per_step, 1.0) * cost.target_step_seconds
        judge = (self.judge_seconds / self.cycles) / step_seconds if self.cycles else 0.0
        alpha = self.acceptance_rate or 0.0
        # E[steps] for non-integer mean gamma: interpolate between floor and ceil.
        lo, frac = int(gamma), gamma - int(gamma)
        steps = (1 - frac) * expected_steps_per_cycle(alpha, lo) + frac * expected_steps_per_cycle(alpha, lo + 1)
        return steps / (gamma * cost.c + cost.b_of(gamma + 1) + judge) * sd

    def record_depth(self, depth: int, accepted: bool) -> None:
        for lst in (self.accepted_by_depth, self.verified_by_depth):
            while len(lst) <= depth:
                lst.append(0)
        self.verified_by_depth[depth] += 1
        self.verified_steps += 1
        if accepted:
            self.accepted_by_depth[depth] += 1
            self.accepted_steps += 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_s"] = self.tokens_per_s
        d["acceptance_rate"] = self.acceptance_rate
        d["mean_gamma"] = self.mean_gamma
        return d
