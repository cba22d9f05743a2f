"""Token-level speculative decoding pieces: proposers, sampling and verification.

Proposers (one small interface, as transformers' ``candidate_generator.py``): given a sequence's tokens,
return up to ``k`` proposed next tokens and, for a model proposer that samples, their draft
distributions.

Verification follows speculative sampling (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Algorithm 1; Chen et al. 2023): proposal ``x_i`` with draft probability ``q(x_i)`` is
accepted with probability ``min(1, p(x_i) / q(x_i))``; at the first rejection a token is drawn from
``norm(max(0, p - q))``; if all ``k`` are accepted a bonus token is drawn from ``p`` at position ``k``.
Deterministic proposers (n-gram) have one-hot ``q``, so acceptance is ``p(x_i)`` and the residual is ``p``
with ``x_i`` removed. Greedy decoding accepts while the proposal equals the argmax, so its output is
identical to plain greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .base import GenerationRequest, SamplingParams, SpecDecodeConfig


@dataclass
class ProposalRow:
    """One sequence asking for proposals: its tokens so far (prompt + generated), at most ``k`` proposals (> 0),
    its speculative-decoding settings, the sampling a model proposer draws with (seeded per row by the
    caller, so proposals do not depend on other rows), and for a proposer that reads the target's features
    (Medusa, EAGLE-3) ``features [n, F]``: the features that proposer asked for (:attr:`.ModelRunner.feature_layers`)
    at the row's last ``n`` committed positions, in the target's dtype, the last one being the position whose
    output predicted the row's last token (from the row's prefill, then from each verification forward)."""

    tokens: list[int]
    k: int
    spec: SpecDecodeConfig
    sampling: SamplingParams
    features: torch.Tensor | None = None


@dataclass
class Proposal:
    """Proposed next tokens (0..k ids) and, from a proposer that samples, their draft distributions
    ``(len(tokens), vocab)`` float32 (None: deterministic proposals, one-hot ``q`` in :func:`verify`)."""

    tokens: list[int]
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """A token-level proposer (one per ``SpecDecodeConfig.method``), as transformers' ``CandidateGenerator``:
    given rows, one :class:`Proposal` per row, in order."""

    method: str

    def propose(self, rows: Sequence[ProposalRow]) -> list[Proposal]: ...


class NgramProposer:
    """Prompt lookup (``method: ngram``): :func:`ngram_propose` on each row with its own lookup lengths."""

    method = "ngram"

    def propose(self, rows: Sequence[ProposalRow]) -> list[Proposal]:
        return [Proposal(ngram_propose(r.tokens, r.k, r.spec.prompt_lookup_max, r.spec.prompt_lookup_min))
                for r in rows]


class DraftModelProposer:
    """A smaller model (``method: draft_model``): one batched call of ``engine`` (an engine with the same
    tokenizer whose ``submit(requests, collect_probs=True)`` returns results with ``token_ids`` and
    ``token_probs``) writes up to ``k`` tokens per row."""

    method = "draft_model"

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def propose(self, rows: Sequence[ProposalRow]) -> list[Proposal]:
        reqs = [GenerationRequest(tuple(r.tokens), r.k, sampling=r.sampling, request_id="spec-draft") for r in rows]
        results = self.engine.submit(reqs, collect_probs=True).result()
        return [Proposal(list(res.token_ids), getattr(res, "token_probs", None)) for res in results]


def ngram_propose(tokens: list[int], k: int, lookup_max: int, lookup_min: int) -> list[int]:
    """Prompt-lookup proposal (vLLM's ``ngram`` method; Saxena 2023, "Prompt Lookup Decoding").

    Tries suffix lengths ``n = lookup_max .. lookup_min``: among the earlier occurrences of the last ``n``
    tokens it takes the most recent one followed by ``k`` tokens and proposes them. When no occurrence is
    followed by ``k`` tokens (on repetitive text the most recent one overlaps the suffix itself, so only a
    token or two follow it) it takes the one followed by the most, as transformers' prompt lookup and vLLM's
    n-gram proposer fall back to an earlier match instead of wasting the slots.

    Args:
        tokens: the whole sequence so far (prompt + generated), token ids.
        k: number of tokens to propose (> 0).
    Returns:
        list of 0..k proposed token ids.
    """
    length = len(tokens)
    if length < 2:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(lookup_max, length - 1), lookup_min - 1, -1):
        # match[s]: tokens[s:s+n] equals the suffix, for every start before the suffix itself.
        match = arr[: length - n] == arr[length - n]
        for i in range(1, n):
            match &= arr[i: length - n + i] == arr[length - n + i]
        starts = np.flatnonzero(match)
        if starts.size == 0:
            continue
        full = starts[starts <= length - n - k]
        start = int(full[-1]) if full.size else int(starts[0])
        return arr[start + n: start + n + k].tolist()
    return []


def make_warpers(params: SamplingParams) -> LogitsProcessorList:
    """transformers logits warpers for ``params`` (temperature, then top-k, then top-p, as ``generate``)."""
    warpers = LogitsProcessorList()
    if params.greedy:
        return warpers
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
    return warpers


def target_probs(logits: torch.Tensor, warpers: LogitsProcessorList) -> torch.Tensor:
    """Processed next-token distributions.

    Args:
        logits: ``[n, vocab]`` float logits for ``n`` consecutive positions of one sequence.
        warpers: from :func:`make_warpers` (temperature/top-k/top-p read only the scores, so the
            ``input_ids`` argument transformers' processors take is a placeholder).
    Returns:
        ``[n, vocab]`` float32 probabilities.
    """
    placeholder = torch.zeros((logits.shape[0], 1), dtype=torch.long)
    return torch.softmax(warpers(placeholder, logits.float()), dim=-1)


def greedy_accepted(proposals: torch.Tensor, real: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """Greedy verification of a whole batch at once: how many leading proposals of each row equal the
    target's argmax (so greedy SD output is identical to plain greedy decoding).

    Args:
        proposals: ``[rows, k]`` long, proposed ids (padding anywhere past a row's own proposals).
        real: ``[rows, k]`` bool, which entries are proposals.
        best: ``[rows, k]`` long, the target's argmax at the positions the proposals fill.
    Returns:
        ``[rows]`` long, accepted proposals per row (the correction or bonus token is ``best`` at that index).
    """
    if proposals.shape[1] == 0:
        return torch.zeros(proposals.shape[0], dtype=torch.long)
    hit = (proposals == best) & real
    return hit.long().cumprod(dim=1).sum(dim=1)


@dataclass
class TokenVerdict:
    """Outcome of verifying one sequence's proposals.

    Attributes:
        tokens: the tokens to append (accepted proposals, then the correction or bonus token).
        accepted: how many proposals held.
        probs: ``[len(tokens), vocab]`` float32, the distribution each token was drawn from
            (sampling only; None for greedy).
    """

    tokens: list[int]
    accepted: int
    probs: torch.Tensor | None = None


def verify(
    proposals: list[int],
    logits: torch.Tensor,
    params: SamplingParams,
    warpers: LogitsProcessorList,
    generator: torch.Generator | None,
    draft_probs: torch.Tensor | None = None,
) -> TokenVerdict:
    """Verify ``k`` proposals against target logits and return the accepted tokens plus one more.

    Args:
        proposals: ``k`` proposed token ids (may be empty: then this is one plain decoding step).
        logits: ``[k + 1, vocab]`` target logits; row ``i`` predicts the token after proposal ``i - 1``
            (row 0 follows the last committed token).
        params: sampling parameters (greedy when temperature is 0).
        warpers: see :func:`target_probs`.
        generator: the request's RNG (sampling only).
        draft_probs: ``[k, vocab]`` draft distributions for a sampling model proposer; None means
            deterministic proposals (one-hot ``q``).
    Returns:
        :class:`TokenVerdict` with ``accepted + 1`` tokens (accepted proposals, then the correction or bonus).
    """
    k = len(proposals)
    if params.greedy:
        best = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < k and proposals[accepted] == best[accepted]:
            accepted += 1
        return TokenVerdict(list(proposals[:accepted]) + [best[accepted]], accepted)

    probs = target_probs(logits, warpers)
    out: list[int] = []
    for i, x in enumerate(proposals):
        p = probs[i]
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        ratio = float(p[x]) / q_x if q_x > 0 else 0.0
        u = torch.rand((), generator=generator).item()
        if u < min(1.0, ratio):
            out.append(x)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = torch.clamp(p - draft_probs[i].to(p.dtype), min=0.0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else p
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return TokenVerdict(out, i, probs[: i + 1])
    out.append(int(torch.multinomial(probs[k], 1, generator=generator)))
    return TokenVerdict(out, k, probs)
