"""Medusa heads in the portable engine: greedy output equals plain decoding token for token (batched and alone,
with and without the prefix cache), sampled output keeps the target distribution (chi-square), the checkpoint
layout is TensorRT-LLM's, and bad settings are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DEMO, check_sampling_keeps_target_distribution, cut_at_eos, greedy_reference
from lookahead_reasoning.backends.base import GenerationRequest, SpecDecodeConfig
from lookahead_reasoning.backends.medusa import WEIGHTS, MedusaHeads
from lookahead_reasoning.backends.portable import PortableEngine
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

MEDUSA = SpecDecodeConfig(method="medusa", num_speculative_tokens=3)
DEMO_HEADS = DEMO / "target-medusa"


def random_heads(model_dir, folder, num_heads: int = 3, seed: int = 0):
    """Medusa heads on ``model_dir``: projections from its output head, residual blocks random (so the heads
    propose tokens that differ from the base head's and are sometimes right, sometimes wrong)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    w = model.get_output_embeddings().weight.detach()
    torch.manual_seed(seed)
    heads = MedusaHeads(w.shape[1], w.shape[0], num_heads, lm_head=w)
    with torch.no_grad():
        for h in heads.heads:
            h[0].linear.weight.normal_(0, 0.3)
    return heads.save_pretrained(folder)


@pytest.fixture(scope="module", params=["tiny", pytest.param("demo", marks=pytest.mark.slow)])
def setup(request, tiny_model_dir, tmp_path_factory):
    """(target dir, engine with heads, engine with heads and no prefix cache, greedy reference continuations)."""
    if request.param == "tiny":
        model_dir = str(tiny_model_dir)
        heads = random_heads(model_dir, tmp_path_factory.mktemp("medusa"))
    else:
        model_dir = str(DEMO / "target")
        heads = DEMO_HEADS if (DEMO_HEADS / WEIGHTS).exists() else random_heads(model_dir, tmp_path_factory.mktemp("m"))
    eng = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32", block_size=4,
                                         medusa_heads=str(heads))
    nocache = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32", prefix_cache=False,
                                             medusa_heads=str(heads))
    yield model_dir, eng, nocache, greedy_reference(model_dir)
    eng.close()
    nocache.close()


def test_medusa_greedy_equals_plain_decoding(setup):
    _, eng, nocache, ref = setup
    reqs = [GenerationRequest(ids, 24, spec=MEDUSA) for ids, _ in ref]
    batched = eng.generate(reqs)
    single = [eng.generate([r])[0] for r in reqs]
    uncached = nocache.generate(reqs)
    for (_ids, want), a, b, c in zip(ref, batched, single, uncached, strict=False):
        assert a.token_ids == b.token_ids == c.token_ids == cut_at_eos(eng, want)
    drafted = sum(r.counters.drafted_tokens for r in batched)
    accepted = sum(r.counters.accepted_tokens for r in batched)
    assert drafted > 0 and 0 < accepted < drafted  # the heads were used, right and wrong


def test_a_fully_cached_prompt_still_proposes_from_its_first_step(setup):
    """A prompt the prefix cache holds whole still gets its last position computed, so its first decoding step
    has a hidden state to propose from: the same request run again drafts exactly as it did the first time."""
    _, eng, _, ref = setup
    req = GenerationRequest(ref[3][0], 24, spec=MEDUSA)
    eng.reset_prefix_cache()
    first = eng.generate([req])[0]
    again = eng.generate([req])[0]  # its prompt (and more) is now in the prefix cache
    assert again.counters.prefill_tokens_cached > 0
    assert again.token_ids == first.token_ids
    assert again.counters.drafted_by_position == first.counters.drafted_by_position
    assert again.counters.forward_passes == first.counters.forward_passes


def test_medusa_and_plain_rows_share_a_batch(setup):
    _, eng, _, ref = setup
    reqs = [GenerationRequest(ids, 24, spec=MEDUSA if i % 2 else SpecDecodeConfig()) for i, (ids, _) in enumerate(ref)]
    for (_ids, want), res in zip(ref, eng.generate(reqs), strict=False):
        assert res.token_ids == cut_at_eos(eng, want)


@pytest.mark.slow
def test_medusa_sampling_keeps_the_target_distribution():
    """The joint distribution of the first 3 sampled tokens over 3,000 seeds, drawn through the committed demo heads
    (proposals from the prefill's and each forward's hidden states, speculative rejection sampling), against the
    exact target distribution (top-k 3, temperature 1.5) computed from the model: chi-square goodness of fit."""
    spec = SpecDecodeConfig(method="medusa", num_speculative_tokens=3, schedule="constant")
    check_sampling_keeps_target_distribution(spec, medusa_heads=str(DEMO_HEADS))


def test_heads_are_saved_in_tensorrt_llm_layout(tmp_path):
    torch.manual_seed(0)
    heads = MedusaHeads(16, 40, 2)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    folder = heads.save_pretrained(tmp_path / "heads")
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"]) == (2, 1)
    keys = set(load_file(str(folder / WEIGHTS)))
    # tensorrt_llm/models/medusa/weight.py::load_medusa_hf reads exactly these names
    assert keys == ({f"{h}.0.linear.{x}" for h in range(2) for x in ("weight", "bias")}
                    | {f"{h}.1.weight" for h in range(2)})
    again = MedusaHeads.from_pretrained(folder)
    x = torch.randn(5, 16)
    assert torch.equal(again(x), heads(x))
    (folder / "config.json").write_text(json.dumps({**cfg, "medusa_num_layers": 2}))
    with pytest.raises(ValueError, match="medusa"):
        MedusaHeads.from_pretrained(folder)


def test_medusa_settings_are_refused_by_name(tiny_model_dir, tmp_path):
    plain = PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1, dtype="float32")
    try:
        with pytest.raises(ValueError, match="spec.method"):
            plain.generate([GenerationRequest([5, 6, 7], 4, spec=MEDUSA)])
        assert plain.generate([GenerationRequest([5, 6, 7], 4)])[0].token_ids  # still serving
    finally:
        plain.close()
    folder = random_heads(str(tiny_model_dir), tmp_path / "heads", num_heads=2)
    eng = PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1, dtype="float32", medusa_heads=str(folder))
    try:
        with pytest.raises(ValueError, match="spec.num_speculative_tokens"):
            eng.generate([GenerationRequest([5, 6, 7], 4, spec=MEDUSA)])  # 3 > 2 heads: refused, not clipped
    finally:
        eng.close()
    with pytest.raises(ValueError, match="medusa"):
        PortableEngine.from_pretrained(str(tiny_model_dir), num_threads=1, medusa_heads=str(tmp_path / "missing"))


def test_tensorrt_llm_medusa_spec_dry_run_accepts_the_heads(tiny_model_dir, tmp_path, capsys):
    """The shipped Medusa engine spec, pointed at Medusa heads of ours (the demo target's when trained, else
    random ones), passes a dry run of the legacy TensorRT-LLM build, whose conversion gets the heads folder and
    its head / block counts; a head count the folder lacks is refused by field name."""
    import yaml
    from conftest import REPO
    from lookahead_reasoning.production.engine_build import main as build_main

    heads = DEMO_HEADS if (DEMO_HEADS / WEIGHTS).exists() else random_heads(str(tiny_model_dir), tmp_path / "h", 4)
    n = json.loads((heads / "config.json").read_text())["medusa_num_heads"]
    spec = yaml.safe_load((REPO / "engines" / "deepseek-r1-distill-qwen-32b-target-medusa.yaml").read_text())
    spec["drafting"].update(checkpoint=str(heads), num_heads=n)
    path = tmp_path / "medusa.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert build_main(["--spec", str(path), "--dry-run", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert f"--medusa_model_dir {heads}" in out and f"--num_medusa_heads {n}" in out and "--num_medusa_layers 1" in out
    spec["drafting"]["num_heads"] = n + 1
    path.write_text(yaml.safe_dump(spec))
    assert build_main(["--spec", str(path), "--dry-run", "--out", str(tmp_path / "c")]) == 2
    assert "drafting.num_heads" in capsys.readouterr().err


@pytest.mark.slow
def test_committed_demo_heads_beat_untrained_heads(tmp_path):
    """The committed heads were trained: through the engine, on held-out problems, they get more tokens per target
    forward than untrained heads (every projection = the target's own output head, i.e. the base head's next token
    proposed again), with the same greedy output."""
    from lookahead_reasoning.evaluation import synthetic as syn

    model_dir = str(DEMO / "target")
    w = AutoModelForCausalLM.from_pretrained(model_dir).get_output_embeddings().weight.detach()
    untrained = MedusaHeads(w.shape[1], w.shape[0], 4, lm_head=w).save_pretrained(tmp_path / "untrained")
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = []
    for p in syn.generate_problems(2, syn.EVAL_SEED, syn.DEFAULT_DIFFICULTY, "long"):
        text = tok.apply_chat_template([{"role": "user", "content": p.question}], add_generation_prompt=True,
                                       tokenize=False)
        prompts.append(tok.encode(text, add_special_tokens=False))
    spec = SpecDecodeConfig(method="medusa", num_speculative_tokens=4)
    out = {}
    for name, heads in (("trained", DEMO_HEADS), ("untrained", untrained)):
        eng = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32", medusa_heads=str(heads))
        try:
            res = eng.generate([GenerationRequest(p, 200, spec=spec) for p in prompts])
        finally:
            eng.close()
        forwards = sum(r.counters.forward_passes for r in res)
        out[name] = ([r.token_ids for r in res], sum(len(r.token_ids) for r in res) / forwards)
    assert out["trained"][0] == out["untrained"][0]
    assert out["trained"][1] > out["untrained"][1] + 0.5, out
