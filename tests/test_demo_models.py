"""The committed demo checkpoints (engines/demo): load offline, solve held-out problems, judge pairs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import compile_enabled
from lookahead_reasoning.core.judge_prompt import build_judge_ids, verdict_token_ids
from lookahead_reasoning.evaluation import synthetic as syn

# LR_DEMO_DIR points the tests at another build (e.g. a fresh `train_demo_models.py --out DIR`).
DEMO = Path(os.environ.get("LR_DEMO_DIR", Path(__file__).resolve().parents[1] / "engines" / "demo"))
ROLES = ("target", "draft", "judge")


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    yield
    mp.undo()


@pytest.fixture(scope="module")
def loaded():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for role in ROLES:
        path = DEMO / role
        assert (path / "model.safetensors").is_file(), f"missing checkpoint {path}"
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        out[role] = (model, tok)
    return out


def style_of(tok) -> str:
    """The task style the trio was trained on: ``long`` (reasoning traces in <think>) when the tokenizer has
    ``</think>``."""
    return "long" if "</think>" in tok.get_vocab() else "short"


MAX_NEW = {"short": 160, "long": 720}


def build_script(name: str):
    """A module of ``build_scripts/`` (not a package), imported by file path."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    folder = Path(__file__).resolve().parents[1] / "build_scripts"
    sys.path.insert(0, str(folder))  # the scripts import each other by name
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def chat_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_checkpoints_are_small_fp16_and_compute_in_fp32(loaded):
    total = sum(f.stat().st_size for role in ROLES for f in (DEMO / role).iterdir())
    assert total <= 30e6, total
    for role in ROLES:
        model, tok = loaded[role]
        assert next(model.parameters()).dtype == torch.float32  # default load computes in fp32
        from safetensors import safe_open

        with safe_open(DEMO / role / "model.safetensors", "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
        gen = json.loads((DEMO / role / "generation_config.json").read_text())
        assert gen["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
        assert gen["pad_token_id"] == tok.convert_tokens_to_ids("<|endoftext|>") == tok.pad_token_id
    # a decoding step of models this small costs per layer, whatever the width: the draft is cheap by depth
    # (measured as c through the engine in the model card), and small in parameters
    p = {role: sum(x.numel() for x in loaded[role][0].parameters()) for role in ROLES}
    layers = {role: loaded[role][0].config.num_hidden_layers for role in ROLES}
    assert layers["draft"] * 8 <= layers["target"] and p["draft"] <= 0.2 * p["target"]


def test_tokenizer(loaded):
    tok = loaded["target"][1]
    for role in ROLES:  # one tokenizer shared by the three models
        assert loaded[role][1].get_vocab() == tok.get_vocab()
    delim = tok.encode("\n\n", add_special_tokens=False)
    assert len(delim) == 1
    ids = tok.encode("That is 4 x 12 = 48.\n\nNow 48 + 2 = 50.\n\n#### 50", add_special_tokens=False)
    assert ids.count(delim[0]) == 2
    assert tok.encode("907", add_special_tokens=False) == [tok.convert_tokens_to_ids(d) for d in "907"]
    a, u = verdict_token_ids(tok)
    assert a != u
    text = tok.apply_chat_template([{"role": "user", "content": "Hi?"}], tokenize=False, add_generation_prompt=True)
    opening = "<think>\n" if style_of(tok) == "long" else ""
    assert text == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n" + opening
    if style_of(tok) == "long":  # one token each, and decoding keeps them (they are not special tokens)
        ids = tok.encode("a.\n\n</think>\n\nb", add_special_tokens=False)
        assert ids.count(tok.convert_tokens_to_ids("</think>")) == 1
        assert "</think>" in tok.decode(ids, skip_special_tokens=True)


@torch.inference_mode()
def greedy(model, tok, prompt: list[int], max_new_tokens: int = 160) -> str:
    ids = torch.tensor([prompt])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens)
    return tok.decode(out[0, len(prompt):], skip_special_tokens=True)


@pytest.mark.slow
def test_target_solves_held_out_problems(loaded):
    from lookahead_reasoning.core.steps import split_reasoning

    model, tok = loaded["target"]
    style = style_of(tok)
    problems = syn.generate_problems(6, syn.EVAL_SEED, style=style)
    solved = 0
    unknown: list[str] = []
    n_steps = 0
    for p in problems:
        text = greedy(model, tok, chat_ids(tok, p.question), MAX_NEW[style])
        answer = split_reasoning(text, "deepseek_r1")[1] if style == "long" else text
        solved += syn.extract_answer(answer) == p.answer
        # the output is step-structured: steps separated by "\n\n", each saying one known thing (the v3 target
        # garbles a step now and then: "That puts it, 10." in the 6th trace)
        steps = text.split("\n\n")[:-1]
        assert steps, text
        unknown += [s for s in steps if syn.step_meaning(s)[0] == "text"]
        n_steps += len(steps)
        if style == "short":
            assert all(syn.parse_step(s) is not None for s in steps), text
    assert solved >= 5, f"target solved {solved}/6 held-out problems"
    assert len(unknown) <= 3, (unknown, n_steps)  # 1 of 137 steps on the machine that trained it


def test_draft_writes_steps(loaded):
    model, tok = loaded["draft"]
    style = style_of(tok)
    p = syn.generate_problems(1, syn.EVAL_SEED, style=style)[0]
    text = greedy(model, tok, chat_ids(tok, p.question), MAX_NEW[style])
    first = text.split("\n\n")[0]
    assert "\n\n" in text and syn.step_meaning(first)[0] != "text", text


@torch.inference_mode()
def verdict(model, tok, a: str, b: str) -> bool:
    ids = torch.tensor([build_judge_ids(tok, a, b)])
    nxt = int(model(input_ids=ids).logits[0, -1].argmax())
    aligned, unaligned = verdict_token_ids(tok)
    assert nxt in (aligned, unaligned)
    return nxt == aligned


def test_judge(loaded):
    """The judge as the `llm` verifier runs it (`core.verifiers`, default options): a normalized match is accepted,
    the arithmetic guard rejects pairs whose numbers or equations differ, the judge decides the rest; so every
    pair below that differs in its numbers tests the guard, the others the judge (trained behind the guard since
    `--judge-guarded`)."""
    from lookahead_reasoning.core.verifiers import pre_verdict

    judge_model, tok = loaded["judge"]

    def accepted(a: str, b: str) -> bool:
        v = pre_verdict(a, b)
        return v.accept if v is not None else verdict(judge_model, tok, a, b)

    if style_of(tok) == "long":  # the trace's step kinds
        assert accepted("Check: 39 + 9 = 48, which matches.", "To verify: 9 + 39 = 48.")
        assert not accepted("Check: 39 + 9 = 48, which matches.", "Check: 39 + 9 = 47, which matches.")
        assert accepted("So far: 39 pencils.", "Running total: 39 pencils.")
        assert not accepted("So far: 39 pencils.", "So far: 36 pencils.")
        assert accepted("Given: She loses 9 pencils.", "The problem says: She loses 9 pencils.")
        assert not accepted("The problem says: Mia loses 9 pencils.", "The problem says: Mia loses 7 pencils.")
        # the v2 judge's first stage judged this aligned (same number, another event); its second stage does not
        assert not accepted("The problem says: She loses 9 pencils.", "The problem says: She finds 9 more pencils.")
        # other operands with the same result: the v2 judge alone could judge these aligned (RESULTS.md, issue 19)
        assert not accepted("Now 20 x 4 = 80 pencils.", "Now 2 x 40 = 80 pencils.")
    assert accepted("Mia has 4 x 12 = 48 pencils.", "That is 12 x 4 = 48 pencils in all.")
    assert accepted("That leaves 48 - 9 = 39.", "Now she has 48 - 9 = 39 pencils.")
    assert not accepted("Mia has 4 x 12 = 48 pencils.", "Mia has 4 x 12 = 46 pencils.")
    assert not accepted("That leaves 48 - 9 = 39.", "That makes 39 + 9 = 48.")


def test_mixed_voice_training_examples_carry_loss_on_their_own_voice_only(loaded):
    """`train_demo_models.lm_example` with an rng: the context mixes the two voices' wordings of the steps, the
    other voice's steps carry no loss, everything else (own-voice steps, delimiters, answer line, EOS) does, and
    the ids are the plain example's tokenization of the mixed text."""
    import random

    tdm = build_script("train_demo_models")
    _, tok = loaded["target"]
    eos = tok.convert_tokens_to_ids(tdm.EOS)
    seen_masked = 0
    for seed in range(20):
        for voice in (0, 1):
            p = syn.generate_problems(1, seed, 2, "long", voice)[0]
            other = p.in_voice(1 - voice)
            ids, labels = tdm.lm_example(tok, p, eos, random.Random(seed))
            plain_ids, plain_labels = tdm.lm_example(tok, p, eos)
            n_prompt = len(chat_ids(tok, p.question))
            text = tok.decode(ids[n_prompt:-1])
            steps = text.split(syn.STEP_DELIMITER)[:len(p.steps)]
            assert all(s in (own, alt) for s, own, alt in zip(steps, p.steps, other.steps, strict=False))
            assert len(ids) == len(labels) and labels[:n_prompt] == [-100] * n_prompt and labels[-1] == eos
            masked = tok.decode([t for t, y in zip(ids[n_prompt:], labels[n_prompt:], strict=False) if y == -100])
            foreign = [s for s, own in zip(steps, p.steps, strict=False) if s != own]
            assert masked.replace(" ", "") == "".join(foreign).replace(" ", "")
            seen_masked += bool(foreign)
            if not foreign:
                assert (ids, labels) == (plain_ids, plain_labels)
    assert seen_masked >= 10


def test_learning_rate_schedule_warms_up_then_decays_to_its_floor():
    """`train_demo_models.learning_rate`: linear warm-up to the peak, then a cosine that never rises and ends at
    ``lr * lr_floor`` (the floor the training record states)."""
    tdm = build_script("train_demo_models")
    for floor in (0.0, 0.025, 0.1, 1.0):
        b = tdm.TrainBudget(steps=1000, minutes=1.0, lr=2e-3, batch_size=16, warmup_steps=100, lr_floor=floor)
        assert tdm.learning_rate(b, 0, 0.0) == pytest.approx(2e-3 / 100)
        assert tdm.learning_rate(b, 99, 0.0) == pytest.approx(2e-3)
        assert tdm.learning_rate(b, 999, 1.0) == pytest.approx(2e-3 * floor)
        assert tdm.learning_rate(b, 500, 0.5) == pytest.approx(2e-3 * (1 + floor) / 2)
        after = [tdm.learning_rate(b, 100 + i, i / 900) for i in range(901)]
        assert all(x >= y - 1e-15 for x, y in zip(after, after[1:], strict=False))


def test_judge_trains_on_the_pairs_the_verifier_asks_it_about():
    """`train_demo_models.reaches_judge` (the filter of `--judge-guarded`) picks exactly the pairs that the semantic
    verifiers' routing (`core.verifiers._Semantic.verify`: normalized match, then the arithmetic guard) hands to
    their judge, on held-out synthetic step pairs of every kind, and both labels remain among them."""
    import asyncio

    from lookahead_reasoning.core.steps import Step
    from lookahead_reasoning.core.verifiers import StepVerdict, _Semantic

    tdm = build_script("train_demo_models")

    class Recording(_Semantic):
        arithmetic_guard = True

        def __init__(self):
            self.asked = []

        async def _judge(self, pairs):
            self.asked += [(t.text, d.text) for t, d in pairs]
            return [StepVerdict(False, 0.0, "recorded") for _ in pairs]

    pairs = syn.generate_step_pairs(600, seed=11, style="long")
    step = lambda text: Step(text, [], [], "stop", "draft")  # noqa: E731
    rec = Recording()
    asyncio.run(rec.verify([(step(a), step(b)) for a, b, _ in pairs]))
    kept = [(a, b) for a, b, _ in pairs if tdm.reaches_judge(a, b)]
    assert kept == rec.asked
    assert 0 < len(kept) < len(pairs)
    assert {y for a, b, y in pairs if tdm.reaches_judge(a, b)} == {True, False}


def test_injected_negatives_keep_their_label_and_reach_the_judge():
    """`train_demo_models.injected_negatives` (`--judge-injected-pairs`): every pair is a not-equivalent pair of the
    input with one of the `INJECTIONS` texts on step B (the forms `tests/test_injection.py` attacks with), each form
    is drawn, and they still reach the judge behind the guard (the texts add no number of their own; the echo form
    restates step A's)."""
    tdm = build_script("train_demo_models")
    pairs = [p for p in syn.generate_step_pairs(3000, seed=12, style="long") if tdm.reaches_judge(p[0], p[1])]
    negatives = {(a, b) for a, b, y in pairs if not y}
    out = tdm.injected_negatives(pairs, 500, seed=3)
    assert len(out) == 500 and not any(y for *_, y in out)
    forms = list(tdm.INJECTIONS.values())
    assert all(any(f(a, b0) == b for f in forms for a0, b0 in negatives if a0 == a) for a, b, _ in out)
    assert {next(k for k, f in tdm.INJECTIONS.items() for a0, b0 in negatives if a0 == a and f(a, b0) == b)
            for a, b, _ in out} == set(tdm.INJECTIONS)
    assert all(tdm.reaches_judge(a, b) for a, b, _ in out)


@pytest.mark.slow
def test_compiled_layers_train_like_eager_and_leave_an_eager_model(loaded):
    """`train_demo_models.compiled_layers` (torch.compile per decoder layer, used to train target and draft): the
    loss and gradients match eager ones for batches of two lengths (one dynamic graph), and afterwards the layers
    run eager again, so generating with a KV cache works. The first compile takes ~10-20 s on 2 cores."""
    with compile_enabled():
        _check_compiled_layers(loaded)


def _check_compiled_layers(loaded):
    tdm = build_script("train_demo_models")
    _, tok = loaded["target"]
    model = tdm.make_model(tdm.ModelSpec(32, 2, 1, 1, 64), tok, seed=0).train()
    batches = tdm.problem_batches(tok, seed=1, batch_size=2, style=style_of(tok), drill_every=0)
    shapes = set()
    for _ in range(2):
        ids, labels = next(batches)
        shapes.add(ids.shape[1])
        ref = model(input_ids=ids, labels=labels, use_cache=False).loss
        ref.backward()
        ref_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        with tdm.compiled_layers(model, True):
            assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
            loss = model(input_ids=ids, labels=labels, use_cache=False).loss
            loss.backward()
        assert float(loss) == pytest.approx(float(ref), rel=1e-4)
        for p, g in zip(model.parameters(), ref_grads, strict=False):
            torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-5)
        model.zero_grad()
    assert len(shapes) == 2, shapes
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    prompt = torch.tensor([chat_ids(tok, "Ann has 3 apples.")])
    with torch.compiler.set_stance("fail_on_recompile"):  # an eager model never compiles
        out = model.eval().generate(prompt, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, prompt.shape[1] + 4)


def test_head_training_learns_only_what_the_target_writes(loaded):
    """Medusa's and EAGLE-3's training rows (build_scripts/train_medusa_heads.py, train_eagle3_head.py): with the
    draft's wording mixed into an answer, a position trains Medusa only when the target writes its next two tokens,
    a head learns a token only while every token from the position's next one up to it is the target's, and
    EAGLE-3's crops label the same way; on a plain answer every position from the last prompt token on is used."""
    tmh, te3 = build_script("train_medusa_heads"), build_script("train_eagle3_head")
    tdm = tmh.tdm
    model, tok = loaded["target"]
    pad = tok.convert_tokens_to_ids(tdm.PAD)
    mixed = tdm.mixed_voice_rows(tok, 6, seed=3, style=style_of(tok))
    first_labelled = [next(i for i, y in enumerate(labels) if y != -100) for _, labels in mixed]
    # draft-worded steps inside
    assert any(-100 in labels[i:] for (_, labels), i in zip(mixed, first_labelled, strict=False))
    p = syn.generate_problems(1, 5, 2, style_of(tok))[0]
    prompt = chat_ids(tok, p.question)
    plain = tdm.answer_rows([(prompt, tok.encode(p.steps[0], add_special_tokens=False))])
    for rows in (mixed, plain):
        hidden, ahead = tmh.features(model, rows, pad)
        want_pos, want_ahead = [], []
        for ids, labels in rows:
            pos = [t for t in range(len(ids) - 2) if labels[t + 1] != -100 and labels[t + 2] != -100]
            want_pos.append(pos)
            for t in pos:
                row = []
                for j in range(t + 2, t + 2 + ahead.shape[1]):
                    ok = j < len(ids) and all(y != -100 for y in labels[t + 1: j + 1])
                    row.append(ids[j] if ok else -100)
                want_ahead.append(row)
        assert hidden.shape[0] == sum(map(len, want_pos)) == ahead.shape[0]
        assert ahead.tolist() == want_ahead
        first = rows[0][0]
        with torch.inference_mode():
            direct = model.get_decoder()(input_ids=torch.tensor([first])).last_hidden_state[0].float()
        assert torch.allclose(hidden[: len(want_pos[0])], direct[want_pos[0]], atol=1e-4)
    assert want_pos == [list(range(len(prompt) - 1, len(plain[0][0]) - 2))]
    for (ids, labels), item in zip(mixed, te3.features(model, mixed, (1, 2, 3), pad), strict=False):
        _, nxt, lab = te3.crop(item, 0, len(ids))
        assert nxt[: len(ids) - 2].tolist() == ids[1:-1]
        pairs = zip(labels[1:], labels[2:], strict=False)
        assert lab[: len(ids) - 2].tolist() == [y2 if y1 != -100 else -100 for y1, y2 in pairs]
