"""EAGLE-3 drafting in the portable engine: greedy output equals plain decoding token for token (batched and alone,
with and without the prefix cache, beside Medusa and plain rows), sampled output keeps the target distribution
(chi-square), the checkpoint layout is the one vLLM and TensorRT-LLM read, and bad settings are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DEMO, build_tiny_model, check_sampling_keeps_target_distribution, cut_at_eos, greedy_reference
from lookahead_reasoning.backends.base import GenerationRequest, SpecDecodeConfig
from lookahead_reasoning.backends.eagle import WEIGHTS, Eagle3Head
from lookahead_reasoning.backends.portable import PortableEngine
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

EAGLE = SpecDecodeConfig(method="eagle3", num_speculative_tokens=3)
MEDUSA = SpecDecodeConfig(method="medusa", num_speculative_tokens=3)
DEMO_HEAD = DEMO / "target-eagle3"
DEMO_MEDUSA = DEMO / "target-medusa"


def random_head(model_dir, folder, seed: int = 0, aux=None, window: int = 8):
    """An EAGLE-3 head for ``model_dir`` with random weights near a head that re-predicts from the deepest feature
    layer (``fc`` picks it, the layer adds little, ``lm_head`` is the target's output head), so its proposals are
    sometimes right, sometimes wrong."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(seed)
    cfg = Eagle3Head.config_for(model.config, aux_layers=aux, attention_window=window)
    head = Eagle3Head(cfg, model.get_input_embeddings().weight, lm_head=model.get_output_embeddings().weight)
    h = cfg.hidden_size
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.requires_grad and p.dim() == 2 and not name.startswith("lm_head"):
                p.normal_(0, 0.05)
        head.fc.weight[:, 2 * h:] += torch.eye(h)
    return head.save_pretrained(folder)


def demo_head(tmp_path_factory):
    model_dir = str(DEMO / "target")
    return DEMO_HEAD if (DEMO_HEAD / WEIGHTS).exists() else random_head(model_dir, tmp_path_factory.mktemp("e"))


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory):
    """A random 4-layer tiny target (EAGLE-3 reads three inner layers)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny4"), layers=4)


@pytest.fixture(scope="module", params=["tiny", pytest.param("demo", marks=pytest.mark.slow)])
def setup(request, tiny4, tmp_path_factory):
    """(engine with an EAGLE-3 head [and Medusa heads for the demo target], the same without prefix cache,
    greedy reference continuations)."""
    if request.param == "tiny":
        model_dir = str(tiny4)
        kw = {"eagle3_head": str(random_head(model_dir, tmp_path_factory.mktemp("eagle"), aux=(1, 2, 3)))}
    else:
        model_dir = str(DEMO / "target")
        kw = {"eagle3_head": str(demo_head(tmp_path_factory)), "medusa_heads": str(DEMO_MEDUSA)}
    eng = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32", block_size=4, **kw)
    nocache = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32", prefix_cache=False, **kw)
    yield eng, nocache, greedy_reference(model_dir)
    eng.close()
    nocache.close()


def test_eagle_greedy_equals_plain_decoding(setup):
    eng, nocache, ref = setup
    reqs = [GenerationRequest(ids, 24, spec=EAGLE) for ids, _ in ref]
    batched = eng.generate(reqs)
    single = [eng.generate([r])[0] for r in reqs]
    uncached = nocache.generate(reqs)
    for (_ids, want), a, b, c in zip(ref, batched, single, uncached, strict=False):
        assert a.token_ids == b.token_ids == c.token_ids == cut_at_eos(eng, want)
    drafted = sum(r.counters.drafted_tokens for r in batched)
    accepted = sum(r.counters.accepted_tokens for r in batched)
    assert drafted > 0 and accepted < drafted  # the head was used (and wrong at times)
    if eng.medusa is not None:  # the demo target's head: right at times too (a random head on a random target rarely)
        assert accepted > 0


def test_a_fully_cached_prompt_still_proposes_from_its_first_step(setup):
    """A request for 2 tokens can only draft at its first step (1 proposal then): it does so whether its prompt
    is prefilled or served from the prefix cache (whose last position is still computed for its features)."""
    eng, _, ref = setup
    eng.reset_prefix_cache()
    long_req = GenerationRequest(ref[3][0], 24, spec=EAGLE)
    first = eng.generate([long_req])[0]
    again = eng.generate([long_req])[0]  # its prompt (and more) is now in the prefix cache
    assert again.counters.prefill_tokens_cached > 0 and again.token_ids == first.token_ids
    short = eng.generate([GenerationRequest(ref[3][0], 2, spec=EAGLE)])[0]
    assert short.counters.prefill_tokens_cached > 0
    assert short.counters.drafted_tokens == 1


def test_eagle_medusa_and_plain_rows_share_a_batch(setup):
    eng, _, ref = setup
    specs = [EAGLE, SpecDecodeConfig()] + ([MEDUSA] if eng.medusa is not None else [])
    reqs = [GenerationRequest(ids, 24, spec=specs[i % len(specs)]) for i, (ids, _) in enumerate(ref)]
    for (_ids, want), res in zip(ref, eng.generate(reqs), strict=False):
        assert res.token_ids == cut_at_eos(eng, want)


@pytest.mark.slow
def test_eagle_sampling_keeps_the_target_distribution(tmp_path_factory):
    """The joint distribution of the first 3 sampled tokens over 3,000 seeds, drawn through the demo target's EAGLE-3
    head, against the exact target distribution (top-k 3, temperature 1.5): chi-square goodness of fit."""
    spec = SpecDecodeConfig(method="eagle3", num_speculative_tokens=3, schedule="constant")
    check_sampling_keeps_target_distribution(spec, eagle3_head=str(demo_head(tmp_path_factory)))


def test_head_is_saved_in_the_eagle3_layout(tiny4, tmp_path):
    folder = random_head(str(tiny4), tmp_path / "head", aux=(1, 2, 3))
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # top level, layer inputs: what vLLM reads
    weights = load_file(str(folder / WEIGHTS))
    layer = {f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    layer |= {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"}
    layer |= {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    # the names vLLM's llama_eagle3.py load_weights maps (midlayer. -> layers.0.) and SafeAILab/EAGLE writes
    assert set(weights) == layer | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    h = cfg["hidden_size"]
    assert weights["fc.weight"].shape == (h, 3 * h) and weights["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    model = AutoModelForCausalLM.from_pretrained(str(tiny4))
    embed = model.get_input_embeddings().weight
    a, b = Eagle3Head.from_pretrained(folder, embed, 4), Eagle3Head.from_pretrained(folder, embed, 4)
    feats = [torch.randn(5, 3 * h), torch.randn(2, 3 * h)]
    assert a.propose(feats, [[3, 4, 5, 6, 7], [8, 9]], 4) == b.propose(feats, [[3, 4, 5, 6, 7], [8, 9]], 4)
    unnamed = {k: v for k, v in cfg.items() if k != "eagle_aux_hidden_state_layer_ids"}
    (folder / "config.json").write_text(json.dumps(unnamed))
    assert Eagle3Head.from_pretrained(folder, embed, 22).aux_layers == (2, 11, 19)  # vLLM's default for 22 layers
    (folder / "config.json").write_text(json.dumps({**cfg, "hidden_size": h * 2}))
    with pytest.raises(ValueError, match="eagle3"):
        Eagle3Head.from_pretrained(folder, embed, 4)


def test_a_padded_row_proposes_as_it_would_alone(tiny4, tmp_path):
    """Rows with fewer features are left-padded in the batched call: each row's chain equals its chain alone."""
    folder = random_head(str(tiny4), tmp_path / "head", aux=(1, 2, 3))
    embed = AutoModelForCausalLM.from_pretrained(str(tiny4)).get_input_embeddings().weight
    head = Eagle3Head.from_pretrained(folder, embed, 4)
    h = head.config.hidden_size
    torch.manual_seed(1)
    feats = [torch.randn(n, 3 * h) for n in (1, 6, 3)]
    toks = [list(range(10, 10 + n)) for n in (1, 6, 3)]
    together = head.propose(feats, toks, 4)
    alone = [head.propose([f], [t], 4)[0] for f, t in zip(feats, toks, strict=False)]
    assert together == alone


def test_eagle_settings_are_refused_by_name(tiny4, tmp_path):
    plain = PortableEngine.from_pretrained(str(tiny4), num_threads=1, dtype="float32")
    try:
        with pytest.raises(ValueError, match="spec.method"):
            plain.generate([GenerationRequest([5, 6, 7], 4, spec=EAGLE)])
        assert plain.generate([GenerationRequest([5, 6, 7], 4)])[0].token_ids  # still serving
    finally:
        plain.close()
    with pytest.raises(ValueError, match="eagle3_head"):
        PortableEngine.from_pretrained(str(tiny4), num_threads=1, eagle3_head=str(tmp_path / "missing"))
    wrong = random_head(str(tiny4), tmp_path / "deep", aux=(1, 2, 9))  # the target has 4 layers
    with pytest.raises(ValueError, match="eagle3_head"):
        PortableEngine.from_pretrained(str(tiny4), num_threads=1, eagle3_head=str(wrong))
    other = build_tiny_model(tmp_path / "other", layers=4, hidden=32)
    with pytest.raises(ValueError, match="eagle3_head"):
        PortableEngine.from_pretrained(str(other), num_threads=1, eagle3_head=str(wrong))


def test_default_feature_layers_follow_vllm():
    cfg = AutoConfig.from_pretrained(str(DEMO / "target"))
    assert Eagle3Head.config_for(cfg).aux_layers == (2, cfg.num_hidden_layers // 2, cfg.num_hidden_layers - 3)


def test_tensorrt_llm_eagle3_spec_dry_run_accepts_the_head(tmp_path_factory, tmp_path, capsys):
    """The shipped EAGLE-3 engine spec, pointed at our demo head, passes a dry run of the LLM-API plan, whose
    options name the head folder and the target layers it was trained on (its feature layers minus one: TensorRT-LLM
    captures layer outputs); another layer set is refused by field name, and so is a folder that is no EAGLE-3 head."""
    import yaml
    from conftest import REPO
    from lookahead_reasoning.production.engine_build import WriteFile, plan_build
    from lookahead_reasoning.production.engine_build import main as build_main
    from lookahead_reasoning.production.engine_specs import load_spec

    head = demo_head(tmp_path_factory)
    aux = json.loads((head / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
    spec = yaml.safe_load((REPO / "engines" / "qwen3-32b-target-eagle3.yaml").read_text())
    spec["drafting"]["checkpoint"] = str(head)
    path = tmp_path / "eagle3.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert build_main(["--spec", str(path), "--dry-run", "--out", str(tmp_path / "b")]) == 0
    assert "speculative_model_dir" in capsys.readouterr().out
    written = {s.path.name: s.content for s in plan_build(load_spec(path), tmp_path / "b").steps
               if isinstance(s, WriteFile)}
    opts = yaml.safe_load(written["llm_api_options.yaml"])["speculative_config"]
    assert opts["decoding_type"] == "Eagle3" and opts["speculative_model_dir"] == str(head)
    assert opts["eagle3_layers_to_capture"] == [i - 1 for i in aux]
    spec["drafting"]["layers_to_capture"] = [0, 1, 2]
    path.write_text(yaml.safe_dump(spec))
    assert build_main(["--spec", str(path), "--dry-run", "--out", str(tmp_path / "c")]) == 2
    assert "drafting.layers_to_capture" in capsys.readouterr().err
    spec["drafting"].pop("layers_to_capture")
    spec["drafting"]["checkpoint"] = str(DEMO_MEDUSA)
    path.write_text(yaml.safe_dump(spec))
    assert build_main(["--spec", str(path), "--dry-run", "--out", str(tmp_path / "d")]) == 2
    assert "drafting.checkpoint" in capsys.readouterr().err


@pytest.mark.slow
def test_committed_demo_head_beats_an_untrained_head(tmp_path):
    """The committed head was trained: through the engine, on held-out problems, it gets more tokens per target
    forward than a freshly initialised head (``lm_head`` from the target's output head), with the same output."""
    from lookahead_reasoning.evaluation import synthetic as syn

    model_dir = str(DEMO / "target")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(0)
    fresh = Eagle3Head(Eagle3Head.config_for(model.config), model.get_input_embeddings().weight,
                       lm_head=model.get_output_embeddings().weight).save_pretrained(tmp_path / "untrained")
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = []
    for p in syn.generate_problems(2, syn.EVAL_SEED, syn.DEFAULT_DIFFICULTY, "long"):
        text = tok.apply_chat_template([{"role": "user", "content": p.question}], add_generation_prompt=True,
                                       tokenize=False)
        prompts.append(tok.encode(text, add_special_tokens=False))
    spec = SpecDecodeConfig(method="eagle3", num_speculative_tokens=4)
    out = {}
    for name, head in (("trained", DEMO_HEAD), ("untrained", fresh)):
        eng = PortableEngine.from_pretrained(model_dir, num_threads=1, dtype="float32", eagle3_head=str(head))
        try:
            res = eng.generate([GenerationRequest(p, 200, spec=spec) for p in prompts])
        finally:
            eng.close()
        forwards = sum(r.counters.forward_passes for r in res)
        out[name] = ([r.token_ids for r in res], sum(len(r.token_ids) for r in res) / forwards)
    assert out["trained"][0] == out["untrained"][0]
    assert out["trained"][1] > out["untrained"][1] + 1.0, out


def test_a_profile_defaulting_to_eagle3_or_medusa_needs_the_heads(tmp_path):
    """A profile whose default target_spec needs heads its target lacks is refused when it loads, naming the
    field; with the head folder it loads (what README's profile example does)."""
    import yaml
    from lookahead_reasoning.profiles import load_profile

    base = {"name": "p", "target": {"path": "demo/target", "dtype": "float32"},
            "draft": {"path": "demo/draft", "dtype": "float32"}, "judge": {"path": "demo/judge", "dtype": "float32"},
            "options": {"judge": {"name": "llm"}}}
    for method, key, folder in (("eagle3", "eagle3", "demo/target-eagle3"), ("medusa", "medusa", "demo/target-medusa")):
        data = {**base, "options": {**base["options"], "target_spec": {"method": method, "num_speculative_tokens": 4}}}
        path = tmp_path / f"{method}.yaml"
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(ValueError, match=f"options.target_spec.method: '{method}' needs target.{key}"):
            load_profile(config=str(path))
        data["target"] = {**data["target"], key: folder}
        path.write_text(yaml.safe_dump(data))
        assert load_profile(config=str(path)).options.target_spec.method == method


def test_a_request_picks_the_sd_method_and_output_stays_ar():
    """sd_method / sd_tokens on a request choose the drafter inside the target's calls (the one request boundary
    every front shares): greedy sd with EAGLE-3 and with Medusa answers exactly as ar, with the method's counters;
    a method the target cannot run, or more Medusa tokens than heads, is refused naming the field."""
    from lookahead_reasoning.core.errors import FieldError
    from lookahead_reasoning.core.request import LRRequest
    from lookahead_reasoning.profiles import build_reasoner, close_reasoner, load_profile

    profile = load_profile("demo")
    reasoner = build_reasoner(profile, need_judge=False)
    prompt = "Max buys 4 cups. Each one costs $3. How much does he pay?"
    try:
        ar = reasoner.run(prompt, options=LRRequest(prompt=prompt, mode="ar", max_tokens=60).options(profile.options))
        for method in ("eagle3", "medusa"):
            opts = LRRequest(prompt=prompt, mode="sd", max_tokens=60, sd_method=method).options(profile.options)
            assert opts.target_spec.method == method
            res = reasoner.run(prompt, options=opts)
            assert res.text == ar.text
            assert res.metrics.target.accepted_tokens > 0
        opts = LRRequest(prompt=prompt, mode="sd", sd_method="medusa", sd_tokens=9).options(profile.options)
        with pytest.raises(FieldError, match="sd_tokens"):
            reasoner.run(prompt, options=opts)
        reasoner.sd_methods.pop("eagle3")  # as for a target without an EAGLE-3 head
        opts = LRRequest(prompt=prompt, mode="lr+sd", sd_method="eagle3").options(profile.options)
        with pytest.raises(FieldError, match="sd_method"):
            reasoner.run(prompt, options=opts)
    finally:
        close_reasoner(reasoner)
