"""The Lookahead Reasoning loop on real (tiny, random) models: the lossless property and loop mechanics.

With the ``exact`` verifier and greedy sampling, ``lr`` and ``lr+sd`` (sync and async) must reproduce the
target's own autoregressive output token for token (docs/design.md section 1.6).
"""

from __future__ import annotations

from collections import Counter

import pytest
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.core.errors import FieldError
from lookahead_reasoning.core.lookahead import LookaheadReasoner, LROptions, as_defaults, with_overrides
from lookahead_reasoning.core.steps import StepConfig
from lookahead_reasoning.core.verifiers import VerifierConfig

PROMPTS = ["Step 1: 4 + 4", "The total is", "Step 2: 12 x 3 = 36.\n\nStep 3:"]


@pytest.fixture(scope="module")
def trio(tiny_model_dir, tiny_draft_dir):
    target = PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1, block_size=4, dtype="float32")
    same = PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1, block_size=4, dtype="float32")
    other = PortableEngine.from_pretrained(str(tiny_draft_dir), num_threads=1, block_size=4, dtype="float32")
    yield target, same, other
    for e in (target, same, other):
        e.close()


@pytest.fixture(scope="module")
def delimiter(trio):
    """The target's most frequent output piece, so steps end by the delimiter often."""
    target = trio[0]
    r = LookaheadReasoner(target, None, use_chat_template=False)
    counts: Counter = Counter()
    for p in PROMPTS:
        res = r.run(p, options=LROptions(mode="ar", max_tokens=60, step=StepConfig(max_step_tokens=60)))
        counts.update(t for t in (target.decode([i]) for i in res.token_ids) if t.strip())
    return counts.most_common(1)[0][0]


def _opts(delim, **kw):
    base = dict(step=StepConfig(delimiter=delim, max_step_tokens=8), max_tokens=48,
                judge=VerifierConfig(name="exact"), gamma=3)
    base.update(kw)
    return LROptions(**base)


@pytest.mark.parametrize("draft_kind", ["same", "other"])
@pytest.mark.parametrize("mode", ["lr", "lr+sd"])
@pytest.mark.parametrize("async_mode", [False, True], ids=["sync", "async"])
def test_lossless_with_exact_verifier(trio, delimiter, draft_kind, mode, async_mode):
    target, same, other = trio
    draft = same if draft_kind == "same" else other
    r = LookaheadReasoner(target, draft, use_chat_template=False)
    accepted = 0
    for p in PROMPTS:
        ar = r.run(p, options=_opts(delimiter, mode="ar"))
        lr = r.run(p, options=_opts(delimiter, mode=mode, async_mode=async_mode))
        assert lr.token_ids == ar.token_ids
        assert lr.text == ar.text
        accepted += lr.metrics.accepted_steps
        assert lr.metrics.generated_tokens == len(lr.token_ids)
    if draft_kind == "same":
        assert accepted > 0  # identical draft: some drafted steps must be accepted


def test_width_and_adaptive_gamma_stay_lossless(trio, delimiter):
    target, same, other = trio
    r = LookaheadReasoner(target, other, use_chat_template=False)
    for p in PROMPTS:
        ar = r.run(p, options=_opts(delimiter, mode="ar"))
        wide = r.run(p, options=_opts(delimiter, mode="lr", width=2))
        adaptive = r.run(p, options=_opts(delimiter, mode="lr", adaptive_gamma=True))
        assert wide.token_ids == ar.token_ids
        assert adaptive.token_ids == ar.token_ids
    # the unrelated draft's steps are rejected, and the controller the requests share has learned it
    opts = _opts(delimiter, mode="lr", adaptive_gamma=True)
    assert r.controller(opts).gamma < opts.gamma
    assert adaptive.metrics.mean_gamma < opts.gamma


def test_budget_and_user_stop(trio, delimiter):
    target, same, _ = trio
    r = LookaheadReasoner(target, same, use_chat_template=False)
    res = r.run(PROMPTS[0], options=_opts(delimiter, mode="lr", max_tokens=5))
    assert res.metrics.generated_tokens <= 5 and res.finish_reason == "length"
    free = r.run(PROMPTS[0], options=_opts(delimiter, mode="ar"))
    stop = free.text[3:5]
    res = r.run(PROMPTS[0], options=_opts(delimiter, mode="lr", stop=(stop,)))
    assert res.finish_reason == "stop" and res.text.endswith(stop) and stop not in res.text[:-len(stop)]
    assert free.text.startswith(res.text)


@pytest.mark.parametrize("mode", ["ar", "sd", "lr", "lr+sd"])
def test_user_stop_spanning_a_step_break(trio, delimiter, mode):
    """A stop string that starts in one step and ends in the next still ends the answer right after it."""
    from lookahead_reasoning.core.steps import split_steps

    target, same, _ = trio
    r = LookaheadReasoner(target, same, use_chat_template=False)
    for p in PROMPTS:
        free = r.run(p, options=_opts(delimiter, mode="ar"))
        steps = split_steps(free.text, delimiter)
        for k in range(len(steps) - 1):  # a step break where the last character of one step and the first two
            b = len("".join(steps[:k + 1]))  # of the next make a string not seen before it
            stop = free.text[b - 1:b + 2]
            if len(stop) == 3 and free.text.find(stop) == b - 1:
                break
        else:
            continue
        break
    else:
        pytest.fail("no answer with a usable step break")
    res = r.run(p, options=_opts(delimiter, mode=mode, stop=(stop,)))
    assert res.finish_reason == "stop"
    assert res.text == free.text[:free.text.find(stop) + len(stop)]


def test_metrics_are_consistent(trio, delimiter):
    target, same, _ = trio
    r = LookaheadReasoner(target, same, use_chat_template=False)
    m = r.run(PROMPTS[2], options=_opts(delimiter, mode="lr+sd")).metrics
    assert m.steps == len([1 for _ in range(m.steps)]) and m.cycles >= 1
    assert m.accepted_steps == sum(m.accepted_by_depth) <= m.verified_steps == sum(m.verified_by_depth)
    assert m.draft.tokens + m.target.tokens == m.generated_tokens
    assert m.target.accepted_tokens <= m.target.proposed_tokens
    assert m.acceptance_rate is None or 0.0 <= m.acceptance_rate <= 1.0


def test_bad_inputs(trio):
    target, same, _ = trio
    r = LookaheadReasoner(target, same, use_chat_template=False)
    with pytest.raises(ValueError, match="prompt"):
        r.run("   ")
    with pytest.raises(ValueError, match="messages"):
        r.run(messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="prompt"):
        r.run("x" * 5000)
    with pytest.raises(ValueError, match="mode"):
        LookaheadReasoner(target, None).run("hi", options=LROptions(mode="lr"))
    assert r.run("Step", options=LROptions(mode="ar", max_tokens=4)).metrics.generated_tokens == 4


def test_max_tokens_beyond_the_context_window(trio):
    """A requested max_tokens that cannot fit is refused by name (as vLLM does); the default budget shrinks."""
    target, same, _ = trio
    prompt = "Step " * 4
    room = target.context_length - len(LookaheadReasoner(target, None, use_chat_template=False)
                                       .prompt_ids(target, prompt, None))
    defaults = LROptions(mode="ar", default_max_tokens=target.context_length,  # a default that cannot fit
                         judge=VerifierConfig(name="exact"))
    r = LookaheadReasoner(target, same, defaults=defaults, use_chat_template=False)
    for mode in ("ar", "lr+sd"):
        with pytest.raises(FieldError) as err:
            r.run(prompt, options=with_overrides(defaults, mode=mode, max_tokens=room + 1))
        assert err.value.field == "max_tokens" and f"at most {room}" in str(err.value)
    res = r.run(prompt, options=with_overrides(defaults, mode="sd"))  # the default budget: shrunk, not refused
    assert 0 < res.metrics.generated_tokens <= room
    # a reasoner's (or a profile's) defaults are defaults: a max_tokens there is the default budget, and shrinks too
    given = LROptions(mode="ar", max_tokens=target.context_length)
    assert as_defaults(given).max_tokens is None and as_defaults(given).default_max_tokens == target.context_length
    res = LookaheadReasoner(target, None, defaults=given, use_chat_template=False).run(prompt)
    assert 0 < res.metrics.generated_tokens <= room


def test_requests_in_flight_is_counted_per_stream(trio, delimiter):
    """Adaptive gamma's load signal: the streams running on the reasoner, this one included."""
    import asyncio

    target, same, _ = trio
    r = LookaheadReasoner(target, same, use_chat_template=False)

    async def one(seen):
        async for _ in r.stream(PROMPTS[0], options=_opts(delimiter, mode="lr", adaptive_gamma=True)):
            seen.append(r.requests_in_flight)

    async def two():
        a, b = [], []
        await asyncio.gather(one(a), one(b))
        return a + b

    seen = asyncio.run(two())
    assert max(seen) == 2 and r.requests_in_flight == 0


def test_adaptive_gamma_rechecks_the_load_before_the_target_verifies(trio, delimiter):
    """Requests that arrive while a cycle's steps are drafted (a burst after a quiet spell) lower the cap before
    the target call: the drafted steps beyond the cap are not verified, at a cap of 0 none and no token-level
    SD either, and the output is unchanged (exact judge, greedy)."""
    target, same, _ = trio

    class Burst:  # the draft engine, with requests arriving during its first call of each request
        def __init__(self, inner, arrivals):
            self.inner, self.arrivals, self.calls = inner, arrivals, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        async def agenerate(self, reqs):
            self.calls += 1
            if self.calls == 1:
                r.requests_in_flight += self.arrivals
            return await self.inner.agenerate(reqs)

    opts = _opts(delimiter, mode="lr+sd", adaptive_gamma=True, adaptive_load_threshold=3)
    ar = LookaheadReasoner(target, same, use_chat_template=False).run(PROMPTS[0], options=_opts(delimiter, mode="ar"))
    for arrivals in (0, 2):
        draft = Burst(same, arrivals)
        r = LookaheadReasoner(target, draft, use_chat_template=False)
        res = r.run(PROMPTS[0], options=opts)
        r.requests_in_flight -= arrivals
        assert res.text == ar.text and r.requests_in_flight == 0
        assert res.metrics.drafted_steps > 0
        if arrivals:  # load 3 = the threshold from the first draft call on: nothing verified, no token SD
            assert res.metrics.verified_steps == 0 and res.metrics.target.proposed_tokens == 0
        else:
            assert res.metrics.verified_steps > 0


def test_overloaded_adaptive_gamma_stops_step_and_token_speculation(trio, delimiter):
    target, same, _ = trio
    r = LookaheadReasoner(target, same, use_chat_template=False)
    ar = r.run(PROMPTS[0], options=_opts(delimiter, mode="ar"))
    opts = _opts(delimiter, mode="lr+sd", adaptive_gamma=True, adaptive_load_threshold=3)
    calm = r.run(PROMPTS[0], options=opts)
    r.requests_in_flight = 2  # two other requests in flight: with this one, load 3 = the threshold, so the cap is 0
    try:
        busy = r.run(PROMPTS[0], options=opts)
    finally:
        r.requests_in_flight = 0
    assert calm.metrics.drafted_steps > 0 and calm.metrics.target.proposed_tokens > 0
    assert busy.metrics.drafted_steps == 0 and busy.metrics.target.proposed_tokens == 0
    assert busy.text == calm.text == ar.text  # exact judge, greedy: lossless either way
