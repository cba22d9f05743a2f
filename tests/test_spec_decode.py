"""Speculative sampling keeps the target distribution; n-gram lookup proposes what followed a match."""

from __future__ import annotations

import torch
from lookahead_reasoning.backends.base import SamplingParams
from lookahead_reasoning.backends.spec_decode import make_warpers, ngram_propose, verify


def _first_token_distribution(draft_probs, proposals_fn, trials=6000, vocab=6):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 1.5]] * 3)
    params = SamplingParams(temperature=1.0)
    warpers = make_warpers(params)
    counts = torch.zeros(vocab)
    for _ in range(trials):
        props = proposals_fn(gen)
        v = verify(props, logits[: len(props) + 1], params, warpers, gen, draft_probs)
        counts[v.tokens[0]] += 1
    return counts / trials, torch.softmax(logits[0], -1)


def test_one_hot_proposals_preserve_target_distribution():
    # A deterministic proposer always proposing token 3 (unlikely under p).
    emp, p = _first_token_distribution(None, lambda g: [3, 0])
    assert 0.5 * (emp - p).abs().sum() < 0.03


def test_model_proposals_preserve_target_distribution():
    q = torch.tensor([[0.05, 0.05, 0.6, 0.1, 0.1, 0.1]] * 2)

    def propose(g):
        return [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]

    emp, p = _first_token_distribution(q, propose)
    assert 0.5 * (emp - p).abs().sum() < 0.03


def test_greedy_verify_accepts_matching_prefix():
    logits = torch.full((4, 5), -5.0)
    for i, t in enumerate([1, 2, 3, 4]):
        logits[i, t] = 5.0
    v = verify([1, 2, 0], logits, SamplingParams(), make_warpers(SamplingParams()), None)
    assert v.tokens == [1, 2, 3] and v.accepted == 2
    v = verify([1, 2, 3], logits, SamplingParams(), make_warpers(SamplingParams()), None)
    assert v.tokens == [1, 2, 3, 4] and v.accepted == 3


def test_ngram_propose_uses_most_recent_longest_match():
    toks = [5, 6, 7, 8, 1, 5, 6, 9, 9, 5, 6]
    assert ngram_propose(toks, 3, lookup_max=2, lookup_min=1) == [9, 9, 5]
    assert ngram_propose([1, 2, 3], 3, 2, 1) == []
    assert ngram_propose([4, 1, 2, 4], 2, 3, 1) == [1, 2]


def test_ngram_propose_falls_back_to_an_earlier_match_with_room():
    # Repetitive text: the most recent match of [2, 3] overlaps the suffix and only 3 tokens follow it; an
    # earlier one is followed by the k = 4 tokens asked for.
    toks = [1, 2, 3] * 10
    assert ngram_propose(toks, 4, lookup_max=2, lookup_min=1) == [1, 2, 3, 1]
    # One token repeated: every earlier match of the suffix is followed by copies of it.
    assert ngram_propose([7] * 48, 4, lookup_max=2, lookup_min=1) == [7, 7, 7, 7]
    # No match has k followers: the one followed by the most wins.
    assert ngram_propose([5, 6, 8, 5, 6], 4, lookup_max=2, lookup_min=1) == [8, 5, 6]


def test_one_drafter_registry_builds_and_refuses_alike():
    """Both in-process runtimes build their proposers from DRAFTERS and refuse a method in the same words."""
    import pytest
    from lookahead_reasoning.backends.base import SpecDecodeConfig
    from lookahead_reasoning.backends.drafters import DRAFTERS, check_method, make_proposers

    assert set(DRAFTERS) == {"ngram", "draft_model", "medusa", "eagle3"}
    engine = object()
    for runtime in ("portable", "llamacpp"):
        assert set(make_proposers(runtime)) == {"ngram"}
        built = make_proposers(runtime, draft_model=engine)
        assert set(built) == {"ngram", "draft_model"} and built["draft_model"].engine is engine
        check_method(runtime, SpecDecodeConfig(), {})
        check_method(runtime, SpecDecodeConfig(method="ngram", num_speculative_tokens=2), built)
        with pytest.raises(ValueError, match=r"^spec\.method: 'draft_model' needs an engine built with a draft_engine"):
            check_method(runtime, SpecDecodeConfig(method="draft_model", num_speculative_tokens=2),
                         make_proposers(runtime))
    medusa = SpecDecodeConfig(method="medusa", num_speculative_tokens=2)
    with pytest.raises(ValueError, match=r"^spec\.method: 'medusa' needs an engine built with medusa_heads"):
        check_method("portable", medusa, make_proposers("portable"))
    with pytest.raises(ValueError, match=r"^spec\.method: 'medusa' runs on the portable runtime only .*hidden states"):
        check_method("llamacpp", medusa, make_proposers("llamacpp"))
    with pytest.raises(ValueError, match="medusa"):
        make_proposers("llamacpp", medusa=object())  # a source for a method the runtime does not run
