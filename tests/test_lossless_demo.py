"""The lossless property on the demo trio: with the ``exact`` verifier and greedy sampling, ``lr`` and ``lr+sd``
(sync and async) reproduce ``ar`` token for token on 50 held-out generated problems."""

from __future__ import annotations

import pytest
from lookahead_reasoning.core.lookahead import with_overrides
from lookahead_reasoning.core.verifiers import VerifierConfig
from lookahead_reasoning.evaluation.answers import load_items
from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile

pytestmark = pytest.mark.slow
N = 50


@pytest.fixture(scope="module")
def demo():
    r = build_reasoner(load_profile("demo"), need_judge=False)
    yield r
    close_reasoner(r)


@pytest.fixture(scope="module")
def reference(demo):
    items = load_items("synthetic", N)
    opts = with_overrides(demo.defaults, mode="ar")
    return items, [demo.run(it.prompt, options=opts) for it in items]


@pytest.mark.parametrize("mode, async_mode", [("lr", False), ("lr+sd", False), ("lr", True), ("lr+sd", True)],
                         ids=["lr-sync", "lr+sd-sync", "lr-async", "lr+sd-async"])
def test_exact_judge_is_lossless_on_demo_trio(demo, reference, mode, async_mode):
    items, ar = reference
    opts = with_overrides(demo.defaults, mode=mode, async_mode=async_mode, judge=VerifierConfig(name="exact"))
    accepted = 0
    for it, ref in zip(items, ar, strict=False):
        res = demo.run(it.prompt, options=opts)
        assert res.token_ids == ref.token_ids, it.prompt
        accepted += res.metrics.accepted_steps
    assert accepted > 0  # the draft's exact steps were accepted: speculation really happened
