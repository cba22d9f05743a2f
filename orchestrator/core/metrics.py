"""Per-request metrics and the analytic speed model of Lookahead Reasoning.

Speed model (docs/design.md section 2; paper arXiv 2506.19830, section 3, synchronous case), in units of
``tau`` = one target decoding forward at batch 1 with one new position (the calibrated
``CostModel.target_step_seconds``); autoregressive decoding pays ``tau`` per output token. One synchronous
cycle commits ``E[steps]`` steps of ``l`` tokens each and costs

    c * v_q(w_q) * F_q  +  F_p * (u(r, w_p) + (w_p - 1) * c')  +  Pi  +  J                     (cost)

- ``F_q``: the draft's decoding forwards per cycle (its ``gamma`` steps, one after another); ``c``: the draft's
  cost per forward relative to the target's;
- ``F_p``: the forwards of the target's batched call, i.e. of its longest branch (the call lasts until the
  last branch ends); ``b(r)``: the cost of a forward over ``r`` rows relative to one row, at the call's mean
  occupancy ``r`` (rows per forward: branches leave the batch as they finish);
- ``v(w)``: the cost of a forward with ``w`` new positions per row relative to one (token-level SD verifies
  ``w - 1`` proposals per forward; ``v(1) = 1``, calibrated), and ``c'`` the cost of one proposed token (``c``
  for a draft-model proposer, 0 for n-gram lookup); ``u(r, w)``: a forward over ``r`` rows of ``w`` positions,
  calibrated jointly where measured (rows and widths do not multiply on CPU), else ``b(r) * v(w)``
  (``CostModel.call_forward_cost``);
- ``Pi``: prefilling the prompt tokens a call has not cached (the target's branches hold the drafted steps):
  ``v(m)`` per call with ``m`` new prompt tokens; ``J``: the judge's time per cycle.

So, with the gain measured in target tokens,

    speedup = E[steps] * l / cost                                                               (1)

    E[steps] = t + sum_{i=1..gamma} A_i,   A_i = P(the first i drafts of a cycle are all accepted)    (2)

with ``t`` the fraction of cycles that end with a target step (1 unless the answer ended on an accepted
draft). Forwards, rows, positions and acceptance are counted in the run; ``c``, ``b`` and ``v`` come from
the calibration. With independent acceptance ``alpha`` per step, ``A_i = alpha^i`` and ``t = 1`` (2) is the
paper's ``(1 - alpha^(gamma+1)) / (1 - alpha)``; with steps of equal length ``l`` and neither SD nor prefill,
``F_q = gamma * l``, ``F_p = l`` and ``r = gamma + 1``, and (1) is docs/design.md's (section 2.5)
``E[steps] / (gamma * c + b(gamma + 1) + J / l)``. ``ar`` gives 1 (less its prefill), ``sd`` its tokens per
forward over the forwards' cost. :func:`iid_steps_per_cycle` keeps the independence form, to show how far it is from the
measured one (``benchmarks/RESULTS.md``: acceptance falls with depth and short answers end cycles early).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from ..backends.base import add_by_position, add_counts


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


@dataclass
class RoleCounters:
    """One role's engine calls in a request (or a run, after :meth:`merge`): the one record of what the target's
    and the draft's calls did, filled by :meth:`account`. Token counts are the role's own tokenizer's, except
    ``tokens``; times are wall-clock seconds.

    Attributes:
        seconds: wall time of the role's calls as the loop waited for them.
        tokens: tokens of this role's steps kept in the answer (target tokenizer).
        calls: engine calls; ``branches``: rows over all calls (the target's branches of a cycle);
            ``cancelled_branches``: rows cancelled before they finished (their forwards were run and count).
        call_tokens: tokens the calls wrote, kept or not.
        call_forwards: per call, the decoding forwards of its longest row, summed (``F_p`` / ``F_q`` of the speed
            model: a call lasts until its last row ends).
        forward_passes: decoding forwards summed over rows; ``forward_positions``: the positions per row those
            forwards computed (padded widths, :class:`~..backends.base.GenerationCounters`).
        proposed_tokens, accepted_tokens: token-level SD proposals inside the calls, and those that reached the
            output; ``proposed_by_position`` / ``accepted_by_position`` the same by position in a forward's
            proposals (0: first), so ``accepted[i] / proposed[i]`` is the acceptance at position ``i``.
        prefill_tokens, prefill_calls: prompt tokens computed rather than served from the prefix cache, in that
            many calls (the last prompt token, fed by the first decoding forward, is not counted).
        lookup_tokens, cached_tokens: prompt tokens looked up in the engine's prefix cache, and those served
            from it (hits), as vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``.
        queue_seconds: per call, the longest wait of its rows between submission and admission to the
            engine's running batch, summed (0 where the backend does not report it).
    """

    seconds: float = 0.0
    tokens: int = 0
    calls: int = 0
    branches: int = 0
    cancelled_branches: int = 0
    call_tokens: int = 0
    call_forwards: int = 0
    forward_passes: int = 0
    forward_positions: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    prefill_tokens: int = 0
    prefill_calls: int = 0
    lookup_tokens: int = 0
    cached_tokens: int = 0
    queue_seconds: float = 0.0

    def account(self, results) -> None:
        """Count one engine call from its ``GenerationResult`` s (rows; cancelled ones included)."""
        self.calls += 1
        self.branches += len(results)
        self.cancelled_branches += sum(r.finish_reason == "cancelled" for r in results)
        self.call_forwards += max((r.counters.forward_passes for r in results), default=0)
        prefill = sum(max(0, r.counters.prefill_tokens_computed - 1) for r in results)
        self.prefill_tokens += prefill
        self.prefill_calls += prefill > 0
        self.queue_seconds += max((r.counters.queue_seconds for r in results), default=0.0)
        for r in results:
            c = r.counters
            self.call_tokens += len(r.token_ids)
            self.forward_passes += c.forward_passes
            self.forward_positions += c.forward_positions
            self.proposed_tokens += c.drafted_tokens
            self.accepted_tokens += c.accepted_tokens
            self.proposed_by_position = add_by_position(self.proposed_by_position, c.drafted_by_position)
            self.accepted_by_position = add_by_position(self.accepted_by_position, c.accepted_by_position)
            self.lookup_tokens += c.prefill_tokens_computed + c.prefill_tokens_cached
            self.cached_tokens += c.prefill_tokens_cached

    def merge(self, other: RoleCounters) -> None:
        """Add ``other``'s counts and times (per-position lists element by element)."""
        for f in fields(self):
            setattr(self, f.name, add_counts(getattr(self, f.name), getattr(other, f.name)))

    def width(self) -> float:
        """Mean positions per row per decoding forward: the padded width the engine reports, else 1 plus the SD
        proposals per forward (1 without forwards)."""
        if not self.forward_passes:
            return 1.0
        return (self.forward_positions or self.forward_passes + self.proposed_tokens) / self.forward_passes


@dataclass
class RequestMetrics:
    """What one request did (or, after :meth:`merge`, a run). Times are wall-clock seconds; token counts are
    target-tokenizer tokens. What the target's and the draft's engine calls did is in ``target`` and ``draft``
    (:class:`RoleCounters`); ``sd_method`` is the token-level SD method inside the target's calls.
    ``steps`` / ``target_steps``: steps in the answer, and those the target wrote; ``drafted_steps``: steps the
    draft wrote, ``verified_steps`` / ``accepted_steps`` those the judge saw and kept (by depth in
    ``verified_by_depth`` / ``accepted_by_depth``); ``fallbacks``: judge calls that failed (drafts rejected);
    ``draft_failures``: draft calls that failed (the request went on target-only); ``gamma_sum``: drafted depth
    summed over cycles.

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
    judge_seconds: float = 0.0
    target: RoleCounters = field(default_factory=RoleCounters)
    draft: RoleCounters = field(default_factory=RoleCounters)
    sd_method: str = "none"
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

    def cycle_cost(self, cost) -> dict[str, float] | None:
        """The terms of equation (1)'s cost per cycle, in target forwards: ``draft`` (``c v_q F_q`` plus the
        draft's prefill), ``target`` (``F_p (u(r, w_p) + (w_p - 1) c')``), ``prefill`` (the target's ``Pi``) and
        ``judge`` (``J``). None without a cost model or a target call."""
        t, d = self.target, self.draft
        if cost is None or not self.cycles or not t.call_forwards:
            return None
        per_cycle = lambda x: x / self.cycles  # noqa: E731
        c = cost.c or 0.0
        mean = lambda tokens, calls: tokens / calls if calls else 0.0  # noqa: E731
        w_t, w_d = t.width(), d.width()
        draft = c * (cost.forward_cost(w_d, draft=True) * per_cycle(d.forward_passes)
                     + cost.forward_cost(mean(d.prefill_tokens, d.prefill_calls), draft=True)
                     * per_cycle(d.prefill_calls))
        proposal = (w_t - 1) * c if self.sd_method == "draft_model" else 0.0
        rows = t.forward_passes / t.call_forwards
        target = per_cycle(t.call_forwards) * (cost.call_forward_cost(rows, w_t) + proposal)
        prefill = cost.forward_cost(mean(t.prefill_tokens, t.prefill_calls)) * per_cycle(t.prefill_calls)
        return {"draft": draft, "target": target, "prefill": prefill,
                "judge": per_cycle(self.judge_seconds) / cost.target_step_seconds}

    def estimate(self, cost, iid: bool = False, free_draft_and_judge: bool = False) -> float | None:
        """Equation (1) with this request's (or run's) counts and the calibrated ``c``, ``b`` and ``v`` of
        ``cost`` (a :class:`~lookahead_reasoning.core.calibration.CostModel`); None without one. Units: generated
        tokens per target step T, so an ``ar`` run gets slightly under 1 (its prompt's prefill); the predicted
        speedup of a run vs ``ar`` is its estimate over the ``ar`` run's (``evaluation.ModeReport.estimate``).

        ``iid=True`` replaces the measured ``E[steps]`` by the independence form with the overall acceptance
        rate and the mean drafted steps per cycle as gamma (paper section 3), for comparison.
        ``free_draft_and_judge=True`` drops the draft's and the judge's cost (``c = 0``, ``J = 0``): the most any
        draft and judge could give at this acceptance (an upper bound).
        """
        terms = self.cycle_cost(cost)
        if terms is None or not self.steps:
            return None
        if free_draft_and_judge:
            terms.update(draft=0.0, judge=0.0)
        if iid:
            steps = iid_steps_per_cycle(self.acceptance_rate or 0.0, self.drafted_steps / self.cycles)
        else:
            steps = self.steps_per_cycle
        total = sum(terms.values())
        if total <= 0:
            raise ValueError("cycle cost must be > 0")
        return steps * (self.generated_tokens / self.steps) / total

    def merge(self, other: RequestMetrics) -> None:
        """Add ``other``'s counts and times to this one (a run's totals; rates are then recomputed from them).
        Labels (``mode``, ``sd_method``) are taken from ``other`` while still at their defaults; the
        per-request ``ttft_seconds`` and ``speedup_estimate`` stay None in a total."""
        for f in fields(self):
            if f.name in ("ttft_seconds", "speedup_estimate"):
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, RoleCounters):
                a.merge(b)
            elif isinstance(a, str):
                if a == f.default:
                    setattr(self, f.name, b)
            else:
                setattr(self, f.name, add_counts(a, b))

    @classmethod
    def from_dict(cls, data: dict) -> RequestMetrics:
        """The inverse of :meth:`to_dict` (derived keys such as ``tokens_per_s`` and unknown keys ignored).

        Raises:
            TypeError: a role record holds an unknown key.
        """
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        for role in ("target", "draft"):
            if isinstance(kw.get(role), dict):
                kw[role] = RoleCounters(**kw[role])
        return cls(**kw)

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
