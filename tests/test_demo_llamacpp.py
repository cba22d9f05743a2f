"""The demo trio on llama.cpp: the GGUF export (build_scripts/export_gguf.py), the model spec's ``tokenizer``, and the
``demo-llamacpp`` profile in every mode, in process and through Triton.

Equivalence is the margin rule of ``tests/test_llamacpp.py`` (llama.cpp's CPU kernels are not batch-invariant): an
output equals the reference until its first difference, which must fall where the reference's top-2 logit margin is
below :data:`MARGIN`, with at least a third of the reference positions compared. The reference for the export is
transformers in float32 on the same checkpoint; for the profile, llama-cpp-python's own plain greedy loop on the same
GGUF (one token per ``eval``).

Needs the ``llamacpp`` extra (``make test`` installs it and requires it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if os.environ.get("LOOKAHEAD_REQUIRE_LLAMACPP") == "1":
    import llama_cpp  # noqa: F401 - make test installs it: missing is a failure
else:
    pytest.importorskip("llama_cpp", reason="the llamacpp extra is not installed")

from lookahead_reasoning.profiles import ENGINES_DIR, PROFILES, ModelSpec, build_reasoner, close_reasoner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build_scripts"))
import export_gguf  # noqa: E402

MARGIN = 1.0  # logits, as tests/test_llamacpp.py
PROFILE = PROFILES["demo-llamacpp"]
N_PROBLEMS = 3
MAX_TOKENS = 160


def first_difference_ok(out: list[int], ref: list[int], margins: list[float], eos) -> int:
    """Positions compared; raises AssertionError when the first difference is at a confident position or the
    output ends early without EOS."""
    d = next((i for i, (a, b) in enumerate(zip(out, ref, strict=False)) if a != b), None)
    if d is not None:
        assert margins[d] < MARGIN, f"first difference at {d}, reference margin {margins[d]:.3f} >= {MARGIN}"
        return d
    n = min(len(out), len(ref))
    assert n == len(ref) or (out and out[-1] in eos), "the output ended early without an EOS"
    return n


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The trio exported afresh to a temporary folder."""
    out = tmp_path_factory.mktemp("gguf")
    assert export_gguf.main(["--out-dir", str(out)]) == 0
    return out


def test_export_is_reproducible_and_holds_the_checkpoint(exported):
    """Two exports are byte-identical, the profile's files (the Makefile's) are current, and every tensor of the
    target GGUF equals the checkpoint's, upcast to float32."""
    import gguf
    from safetensors.numpy import load_file

    again = export_gguf.export(ENGINES_DIR / "demo" / "target", exported / "again.gguf")
    assert again.read_bytes() == (exported / "target-f32.gguf").read_bytes()
    for role in ("target", "draft", "judge"):
        built = getattr(PROFILE, role).located_path()
        assert built.read_bytes() == (exported / f"{role}-f32.gguf").read_bytes(), f"{built} is stale: run make install"
    reader = gguf.GGUFReader(str(exported / "target-f32.gguf"))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    state = load_file(str(ENGINES_DIR / "demo" / "target" / "model.safetensors"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, 22)
    assert len(tensors) == len(state)
    for hf_name, value in state.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        np.testing.assert_array_equal(tensors[name].reshape(value.shape), value.astype(np.float32), err_msg=name)
    assert reader.fields["tokenizer.ggml.tokens"].data and reader.fields["general.architecture"]


def test_export_refuses_what_it_cannot_write(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt_neox"}')
    with pytest.raises(ValueError, match="model_type"):
        export_gguf.export(folder, tmp_path / "x.gguf")


@pytest.mark.parametrize("role", ["target", "draft"])
def test_llama_cpp_decodes_the_export_as_transformers_does(exported, role):
    """Greedy decoding of one demo problem, llama.cpp on the GGUF against transformers on the checkpoint."""
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ENGINES_DIR / "demo" / role
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Ana has 3 boxes with 4 pens each. She gives away 5 "
                                                                  "pens. How many pens does she have?"}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False, output_scores=True,
                         return_dict_in_generate=True)
    ref = out.sequences[0, len(prompt):].tolist()
    margins = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    llm = Llama(str(exported / f"{role}-f32.gguf"), n_ctx=1024, n_threads=1, verbose=False)
    got = []
    for t in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
        got.append(int(t))
        if len(got) >= len(ref) or t == llm.token_eos():
            break
    llm.close()
    assert first_difference_ok(got, ref, margins, {tok.eos_token_id}) >= len(ref) // 3


def test_model_spec_tokenizer_and_load_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="tokenizer"):
        ModelSpec(path="demo/gguf/target-f32.gguf", runtime="llamacpp", tokenizer="no/such/folder").tokenizer_path()
    assert ModelSpec(path="demo/gguf/target-f32.gguf", runtime="llamacpp",
                     tokenizer="demo/target").tokenizer_path() == ENGINES_DIR / "demo" / "target"
    with pytest.raises(ValueError, match="n_gpu_layers"):
        ModelSpec(path="demo/target", n_gpu_layers=4)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF not really")
    with pytest.raises(ValueError, match=r"^path: transformers could not read the GGUF .*broken\.gguf") as info:
        ModelSpec(path=str(bad), runtime="llamacpp").tokenizer_path()
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_cli_reports_an_unreadable_gguf_in_one_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF not really")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"name: broken\ntarget: {{path: {bad}, runtime: llamacpp}}\n")
    proc = subprocess.run([sys.executable, "-m", "lookahead_reasoning.cli", "generate", "--config", str(cfg),
                           "--prompt", "hi", "--mode", "ar"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "broken.gguf" in proc.stderr


@pytest.fixture(scope="module")
def problems():
    from lookahead_reasoning.evaluation.answers import load_items

    return [it.prompt for it in load_items("synthetic", N_PROBLEMS)]


@pytest.fixture(scope="module")
def reasoner():
    r = build_reasoner(PROFILE)
    yield r
    close_reasoner(r)


@pytest.fixture(scope="module")
def reference(reasoner, problems):
    """llama-cpp-python's plain greedy loop on the target GGUF: (tokens, top-2 margins) per problem."""
    from llama_cpp import Llama

    llm = Llama(str(PROFILE.target.located_path()), n_ctx=1024, n_threads=1, verbose=False, logits_all=True)
    eos = set(reasoner.target.eos_token_ids)
    out = []
    for q in problems:
        llm.reset()
        llm.eval(reasoner.prompt_ids(reasoner.target, None, [{"role": "user", "content": q}]))
        toks, margins = [], []
        while len(toks) < MAX_TOKENS:
            scores = np.asarray(llm.scores[llm.n_tokens - 1])
            second, first = np.argsort(scores)[-2:]
            toks.append(int(first))
            margins.append(float(scores[first] - scores[second]))
            if toks[-1] in eos:
                break
            llm.eval([toks[-1]])
        out.append((toks, margins))
    llm.close()
    return out


MODES = [
    ("ar", {}),
    ("sd", {"target_spec": {"method": "ngram", "num_speculative_tokens": 4}}),
    ("sd", {}),  # the profile's draft-model SD
    ("lr", {}),
    ("lr+sd", {}),
    ("lr+sd", {"adaptive_gamma": True}),
    ("lr+sd", {"async_mode": True}),
]


@pytest.mark.parametrize("mode, extra", MODES, ids=["ar", "sd-ngram", "sd-draft", "lr", "lr+sd", "adaptive", "async"])
def test_every_mode_with_the_exact_judge_reproduces_plain_llama_cpp(reasoner, problems, reference, mode, extra):
    """Every mode on demo-llamacpp (all three roles on llama.cpp) with the exact judge, greedy: the reference's tokens
    under the margin rule; the speculative modes really use the draft's steps or tokens."""
    assert {reasoner.target.name, reasoner.draft.name, reasoner.judge_engine.name} == {"llamacpp"}
    compared, used = 0, 0
    for q, (ref, margins) in zip(problems, reference, strict=False):
        opts = reasoner.options(mode=mode, max_tokens=MAX_TOKENS, judge={"name": "exact"}, **extra)
        res = reasoner.run(messages=[{"role": "user", "content": q}], options=opts)
        compared += first_difference_ok(res.token_ids, ref, margins, set(reasoner.target.eos_token_ids))
        m = res.metrics
        used += m.accepted_steps + m.target.accepted_tokens
    assert compared >= sum(len(r) for r, _ in reference) // 3
    assert (used > 0) == (mode != "ar")


def test_the_llm_judge_default_answers_the_problems(reasoner, problems):
    """The profile's own defaults (llm judge with the arithmetic guard, lr+sd): the answers are graded right as
    often as ar's, and steps are accepted."""
    from lookahead_reasoning.evaluation.answers import check_answer, load_items

    items = load_items("synthetic", N_PROBLEMS)
    right = {"ar": 0, "lr+sd": 0}
    accepted = 0
    for it in items:
        for mode in right:
            res = reasoner.run(messages=[{"role": "user", "content": it.prompt}], options=reasoner.options(mode=mode))
            right[mode] += bool(check_answer(it, res.text, reasoner.reasoning_parser))
            accepted += res.metrics.accepted_steps
    assert right["ar"] >= N_PROBLEMS - 1 and right["lr+sd"] >= right["ar"] - 1
    assert accepted > 0


@pytest.mark.slow
@pytest.mark.server
def test_triton_serves_demo_llamacpp_like_in_process(tmp_path_factory, problems):
    """Through a real Triton server (role models hosting llama.cpp engines), ar and lr+sd answers equal a fresh
    in-process reasoner's that is sent the same requests in the same order, one at a time on both sides (so each
    llama_decode holds the same tokens and copies prefixes computed the same way: llama.cpp is not batch-invariant)."""
    from conftest import start_server
    from lookahead_reasoning.serving.client import TritonLRClient

    server = start_server(tmp_path_factory, None, profile="demo-llamacpp")
    try:
        client = TritonLRClient(server.grpc_url, "grpc", timeout_s=300)
        served = {m: [asyncio.run(client.generate(q, mode=m, max_tokens=MAX_TOKENS)) for q in problems]
                  for m in ("ar", "lr+sd")}
        assert server.engine_dtypes().get("target") == "F32"
    finally:
        server.stop()
    fresh = build_reasoner(PROFILE)
    try:
        for m, outs in served.items():
            for q, s in zip(problems, outs, strict=False):
                local = fresh.run(q, options=fresh.options(mode=m, max_tokens=MAX_TOKENS))
                assert s.text == local.text, (m, q)
    finally:
        close_reasoner(fresh)
