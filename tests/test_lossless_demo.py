"""The lossless property on the demo trio: with the ``exact`` verifier and greedy sampling, ``lr`` and ``lr+sd``
(sync and async) reproduce ``ar`` token for token on 10 held-out generated problems. Each mode answers the 10
problems concurrently (the engines batch them in flight, as a server does): the property must hold whatever rows
share a batch."""

from __future__ import annotations

import asyncio

import pytest
from lookahead_reasoning.core.lookahead import with_overrides
from lookahead_reasoning.core.verifiers import VerifierConfig
from lookahead_reasoning.evaluation.answers import load_items
from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile

pytestmark = pytest.mark.slow
N = 10


@pytest.fixture(scope="module")
def demo():
    r = build_reasoner(load_profile("demo"), need_judge=False)
    yield r
    close_reasoner(r)


def answers(reasoner, items, opts):
    """Every item's answer under ``opts``, all requests in flight at once."""
    async def gather():
        return await asyncio.gather(*(reasoner.generate(it.prompt, options=opts) for it in items))
    return asyncio.run(gather())


@pytest.fixture(scope="module")
def reference(demo):
    items = load_items("synthetic", N)
    return items, answers(demo, items, with_overrides(demo.defaults, mode="ar"))


@pytest.mark.parametrize("mode, async_mode", [("lr", False), ("lr+sd", False), ("lr", True), ("lr+sd", True)],
                         ids=["lr-sync", "lr+sd-sync", "lr-async", "lr+sd-async"])
def test_exact_judge_is_lossless_on_demo_trio(demo, reference, mode, async_mode):
    items, ar = reference
    opts = with_overrides(demo.defaults, mode=mode, async_mode=async_mode, judge=VerifierConfig(name="exact"))
    results = answers(demo, items, opts)
    for it, ref, res in zip(items, ar, results, strict=True):
        assert res.token_ids == ref.token_ids, it.prompt
    assert sum(res.metrics.accepted_steps for res in results) > 0  # speculation really happened
