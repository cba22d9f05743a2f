"""Per-request metrics and the analytic speed model of Lookahead Reasoning.

Speed model (DESIGN.md section 1; paper arXiv 2506.19830, section 3, synchronous case), in units of
``tau`` = one target decoding forward at batch 1 with one new position (the calibrated
``CostModel.target_step_seconds``). Autoregressive decoding pays ``tau`` per output token. One synchronous
cycle commits ``E[steps]`` steps of ``l`` tokens each and costs

    D * c * f_q  +  l_t * b(n) * f_p  +  J                                                    (cost)

where ``D`` is the draft tokens written per cycle, ``c`` the draft's cost per token relative to the
target's, ``l_t`` the mean tokens of one target branch, ``b(n)`` the cost of a batched call with ``n``
branches relative to one branch, ``J`` the judge's time per cycle (in ``tau``), and ``f = v(w) / s`` the
cost per token under token-level speculative decoding: ``s`` tokens come out of each forward whose ``w``
positions per row cost ``v(w)`` plain forwards (``f = 1`` without SD; ``v`` is calibrated), plus, when a
draft model proposes the ``w - 1`` tokens, their cost: ``f = (v(w) + (w - 1) * c) / s``. So

    speedup = E[steps] * l / (D * c * f_q + l_t * b(n) * f_p + J)                              (1)

The gain side is the run's measured acceptance by depth:

    E[steps] = t + sum_{i=1..gamma} A_i,   A_i = P(the first i drafts of a cycle are all accepted)    (2)

with ``t`` the fraction of cycles that end with a target step (1 unless the answer ended on an accepted
draft). With independent acceptance ``alpha`` per step, ``A_i = alpha^i`` and ``t = 1``, (2) is the paper's
``(1 - alpha^(gamma+1)) / (1 - alpha)``; with equal step lengths ``l = l_t``, ``D = gamma * l`` and no SD, (1)
is DESIGN.md's ``E[steps] / (gamma * c + b(gamma + 1) + J / l)``. ``ar`` gives 1 and ``sd`` gives ``s / v(w)``.
:func:`iid_steps_per_cycle` keeps the independence form, to show how far it is from the measured one
(``benchmarks/RESULTS.md``: acceptance falls with depth and short answers end cycles early).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


def iid_steps_per_cycle(alpha: float, gamma: float) -> float:
    """``sum_{i=0..gamma} alpha^i``: equation (2) under independent acceptance (paper section 3).

    Args:
        alpha: step acceptance probability in [0, 1].
        gamma: drafted steps per cycle (>= 0); a fractional mean gamma interpolates between its floor and ceiling.
    Raises:
        ValueError: ``alpha`` outside [0, 1] or ``gamma < 0``.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma: must be >= 0, got {gamma}")
    lo, frac = int(gamma), gamma - int(gamma)
    total = lambda g: float(sum(alpha**i for i in range(g + 1)))  # noqa: E731
    return (1 - frac) * total(lo) + frac * total(lo + 1)


def estimate_speedup(steps_per_cycle: float, step_tokens: float, draft_tokens: float, branch_tokens: float,
                     c: float, b: float, judge: float = 0.0, f_target: float = 1.0, f_draft: float = 1.0) -> float:
    """Equation (1) of this module.

    Args:
        steps_per_cycle: ``E[steps]``, equation (2) (or :func:`iid_steps_per_cycle`).
        step_tokens: ``l``, output tokens per committed step.
        draft_tokens: ``D``, draft tokens written per cycle (0 without drafting).
        branch_tokens: ``l_t``, tokens per target branch.
        c: draft cost per token / target cost per token.
        b: ``b(n)`` for the cycle's ``n`` target branches (1.0 for one).
        judge: ``J``, judge time per cycle in target forwards.
        f_target, f_draft: ``v(w) / s`` of token-level SD in the target's and the draft's calls (1.0 without).
    Returns:
        the estimated speedup over autoregressive decoding (float, > 0).
    Raises:
        ValueError: a non-positive cycle cost.
    """
    cost = draft_tokens * c * f_draft + branch_tokens * b * f_target + judge
    if cost <= 0:
        raise ValueError("cycle cost must be > 0")
    return steps_per_cycle * step_tokens / cost


@dataclass
class RequestMetrics:
    """What one request did (or, after :meth:`merge`, a run). Times are wall-clock seconds; token counts are
    target-tokenizer tokens, except ``draft_call_tokens`` (all tokens the draft wrote, accepted or not),
    ``draft_forward_passes`` and ``draft_proposed_tokens`` (token-level SD proposals inside the draft's calls),
    which count the draft's own tokens. ``target_call_tokens`` / ``target_forward_passes`` /
    ``target_drafted_tokens`` are the same for the target's calls (``target_branches`` branches in
    ``target_calls`` calls).

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
    draft_call_tokens: int = 0
    draft_forward_passes: int = 0
    draft_proposed_tokens: int = 0
    target_calls: int = 0
    target_forward_passes: int = 0
    target_branches: int = 0
    target_call_tokens: int = 0
    target_drafted_tokens: int = 0
    target_accepted_tokens: int = 0
    target_sd_method: str = "none"
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
    def steps_per_cycle(self) -> float | None:
        """``E[steps]`` of equation (2) from the measured acceptance by depth (None without cycles)."""
        if not self.cycles:
            return None
        return self.target_steps / self.cycles + sum(self.accepted_by_depth) / self.cycles

    def estimate(self, cost, iid: bool = False, free_draft_and_judge: bool = False) -> float | None:
        """Equation (1) with this request's (or run's) counts and the calibrated ``c``, ``b(n)`` and ``v(w)`` of
        ``cost`` (a :class:`~lookahead_reasoning.calibration.CostModel`); None without one.

        ``iid=True`` replaces the measured ``E[steps]`` by the independence form with the overall acceptance
        rate and the mean drafted depth (paper section 3), for comparison. ``free_draft_and_judge=True`` sets
        ``c = 0`` and ``J = 0``: the most any draft and judge could give at this acceptance (an upper bound).
        """
        if cost is None or not self.cycles or not self.steps or not self.target_calls:
            return None
        tau = cost.target_step_seconds
        per_cycle = lambda x: x / self.cycles  # noqa: E731
        if iid:  # mean drafted steps per cycle as gamma (width 1)
            steps = iid_steps_per_cycle(self.acceptance_rate or 0.0, per_cycle(self.drafted_steps))
        else:
            steps = self.steps_per_cycle
        c = cost.c if cost.c is not None and not free_draft_and_judge else 0.0
        judge = 0.0 if free_draft_and_judge else per_cycle(self.judge_seconds) / tau
        f_t = cost.sd_cost_per_token(self.target_forward_passes, self.target_call_tokens, self.target_drafted_tokens,
                                     proposer_c=cost.c if self.target_sd_method == "draft_model" else 0.0)
        f_d = cost.sd_cost_per_token(self.draft_forward_passes, self.draft_call_tokens, self.draft_proposed_tokens,
                                     draft=True)
        return estimate_speedup(
            steps_per_cycle=steps, step_tokens=self.generated_tokens / self.steps,
            draft_tokens=per_cycle(self.draft_call_tokens), branch_tokens=self.target_call_tokens / self.target_branches,
            c=c, b=cost.b_of(self.target_branches / self.target_calls), judge=judge,
            f_target=f_t, f_draft=f_d)

    def merge(self, other: "RequestMetrics") -> None:
        """Add ``other``'s counts and times to this one (a run's totals; rates are then recomputed from them).
        Labels (``mode``, ``target_sd_method``) are taken from ``other`` while still at their defaults; the
        per-request ``ttft_seconds`` and ``speedup_estimate`` stay None in a total."""
        for f in fields(self):
            if f.name in ("ttft_seconds", "speedup_estimate"):
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, list):
                a.extend([0] * (len(b) - len(a)))
                for i, x in enumerate(b):
                    a[i] += x
            elif isinstance(a, str):
                if a == f.default:
                    setattr(self, f.name, b)
            else:
                setattr(self, f.name, a + b)

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
