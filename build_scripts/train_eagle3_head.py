#!/usr/bin/env python
"""Train an EAGLE-3 draft head for a target by self-distillation on its own greedy answers and on mixed-voice
contexts.

Li et al. 2025, "EAGLE-3", section 3: the target is frozen; the head reads the target's features from three layers
(:func:`lookahead_reasoning.backends.eagle.default_aux_layers`) and learns the token two positions past each
feature, and with "training-time test" also its own later steps: at step ``s`` the feature of each position is the
head's own step ``s - 1`` output at the position before, and the position attends to the true features up to its
anchor ``s`` positions back plus its own chain (the mask below). The head is saved in the layout vLLM and
TensorRT-LLM read (see :mod:`lookahead_reasoning.backends.eagle`).

What it does, on the synthetic long-reasoning task of the demo trio:

1. the target answers ``--problems`` training problems greedily (seeds derived from ``--seed``, never the
   evaluation seeds) and ``--eval-problems`` held-out ones (``synthetic.EVAL_SEED``); ``--mixed-problems`` more
   answers mix the draft's wording into the target's, labelled only where the target writes
   (``train_demo_models.mixed_voice_rows``: inside Lookahead Reasoning the target reads contexts made mostly of
   accepted drafted steps, and a head trained on its own answers alone proposes much worse there);
2. one forward of the frozen target over each prompt + answer gives the three feature layers at every position;
3. the head trains on random crops of ``--crop`` positions, ``--steps`` chained steps per crop (loss weighted
   ``0.8 ** s``), attending to a random window of 1 .. ``--window`` true positions (the engine keeps at most
   ``--window`` per row, and fewer right after a prefill), for ``--minutes`` at most. Crops start no earlier than
   two positions before the answer, so prompt positions are never keys in training, while the engine's window
   right after a prefill holds prompt positions: a known mismatch for a request's first tokens, left as it is so
   that the committed head stays what this script makes;
4. the greedy chain's acceptance by depth and the tokens per target forward it implies are measured on the held-out
   answers and written to ``<out>/eval.json`` with a model card.

Usage::

    python build_scripts/train_eagle3_head.py --target engines/demo/target --out engines/demo/target-eagle3
    python build_scripts/train_eagle3_head.py --out /tmp/eagle3 --quick   # ~1 min
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_demo_models as tdm  # noqa: E402  (also puts the package on sys.path for a bare checkout)
from lookahead_reasoning.backends.eagle import Eagle3Head  # noqa: E402
from train_medusa_heads import answers, mixed_figure  # noqa: E402

syn = tdm.syn


@torch.inference_mode()
def features(model, rows: list[tuple[list[int], list[int]]], layers: tuple[int, ...], pad: int,
             batch_size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per sequence ``(features [T, 3H] float16, ids [T] int64, labels [T] int64)``: the target's hidden states of
    ``layers`` (``output_hidden_states`` indices) at every position of the row's ``ids``, and its labels (-100
    where the target does not write the token: the prompt, the draft's wording; ``train_demo_models.answer_rows`` /
    ``mixed_voice_rows``)."""
    out = []
    for s in range(0, len(rows), batch_size):
        chunk = rows[s: s + batch_size]
        ids_t, _ = tdm.pad_batch([(x, x) for x, _ in chunk], pad)
        states = model(input_ids=ids_t, output_hidden_states=True).hidden_states
        f = torch.cat([states[i] for i in layers], -1).half()
        for r, (ids, labels) in enumerate(chunk):
            out.append((f[r, : len(ids)].clone(), torch.tensor(ids), torch.tensor(labels)))
    return out


def first_label(item) -> int:
    """Index of the row's first labelled token (a plain answer's start; its length if none is)."""
    where = (item[2] != -100).nonzero()
    return int(where[0, 0]) if len(where) else len(item[2])


def crop(item, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One crop of a sequence from position ``start``: features ``[length, 3H]`` (pair ``j`` = position
    ``start + j``), ``nxt [length]`` (the token after each position), ``label [length]`` (the token two after,
    when it and the token after the position are labelled, i.e. written by the target; -100 otherwise, past the end
    and in the padding)."""
    feat, ids, labels = item
    end = min(start + length, len(ids) - 2)
    m = max(0, end - start)
    f = torch.zeros((length, feat.shape[1]), dtype=torch.float32)
    f[:m] = feat[start:end].float()
    t1 = torch.zeros(length, dtype=torch.long)
    t1[:m] = ids[start + 1: end + 1]
    t2 = torch.full((length,), -100, dtype=torch.long)
    t2[:m] = torch.where(labels[start + 1: end + 1] != -100, labels[start + 2: end + 2], -100)
    return f, t1, t2


def random_crops(data, n: int, length: int, gen: torch.Generator):
    """``n`` crops of random sequences, each starting anywhere from two positions before its first labelled token:
    stacked ``(features [n, length, 3H], nxt [n, length], label [n, length])``."""
    out = []
    for i in torch.randint(len(data), (n,), generator=gen).tolist():
        ids = data[i][1]
        lo = max(0, first_label(data[i]) - 2)
        start = int(torch.randint(lo, max(lo + 1, len(ids) - 2), (1,), generator=gen))
        out.append(crop(data[i], start, length))
    return tuple(torch.stack(x) for x in zip(*out, strict=False))


def ttt_logits(head: Eagle3Head, feats: torch.Tensor, nxt: torch.Tensor, steps: int, window: int) -> list[torch.Tensor]:
    """Training-time test: logits ``[B, C, draft_vocab]`` of each of ``steps`` chained steps. At step ``s`` query
    ``j`` is the chain anchored at true position ``j - s``: its feature is step ``s - 1``'s output at ``j - 1``, and it
    attends to step-0 keys at ``j - s - window < i <= j - s`` and to step ``u``'s key at ``j - s + u`` (1 <= u <= s),
    exactly what the engine's proposer computes for proposal ``s`` with ``window`` true positions."""
    b, c, _ = feats.shape
    pos = torch.arange(c).expand(b, -1)
    i = torch.arange(c)
    hidden = head.fc(feats)
    keys, values, out, prev = [], [], [], None
    for s in range(steps):
        if prev is not None:
            hidden = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], 1)
        q, k, v = head.qkv(hidden, nxt, pos)
        keys.append(k)
        values.append(v)
        d = i[:, None] - s - i[None, :]  # j - s - i
        blocks = [(d >= 0) & (d < window)]
        for u in range(1, s + 1):
            blocks.append(i[None, :] == i[:, None] - s + u)
        mask = torch.cat(blocks, 1)  # block s (u = s) is each query's own key, so no row is empty
        attn = head.attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask[None, None])
        logits, prev = head.finish(attn, hidden)
        out.append(logits)
    return out


def chain_metrics(head: Eagle3Head, data, steps: int, window: int, length: int = 256) -> dict:
    """Greedy chain acceptance on held-out answers: step ``s`` of the chain anchored at ``m`` counts only when steps
    ``0 .. s - 1`` were right, as the engine's verification counts it; tokens per target forward = 1 + mean
    accepted proposals per anchor."""
    hits, reached, anchors = [0] * steps, [0] * steps, 0
    with torch.inference_mode():
        for item in data:
            for start in range(max(0, first_label(item) - 2), len(item[1]) - 2, length):
                f, n, lab = (x[None] for x in crop(item, start, length))
                right = torch.stack([lg.argmax(-1) == lab for lg in ttt_logits(head, f, n, steps, window)])[:, 0]
                valid = (lab[0] != -100).tolist()
                right = right.tolist()
                for m in range(length):  # the chain anchored at m: its step s is query m + s
                    if not valid[m]:
                        continue
                    anchors += 1
                    for s in range(steps):
                        if m + s >= length or not valid[m + s]:
                            break
                        reached[s] += 1
                        if not right[s][m + s]:
                            break
                        hits[s] += 1
    accepted = sum(hits)
    return {
        "anchors": anchors,
        "chain_acceptance_by_depth": [round(h / max(r, 1), 4) for h, r in zip(hits, reached, strict=False)],
        "mean_accepted_per_forward": round(accepted / max(anchors, 1), 3),
        "tokens_per_forward": round(1 + accepted / max(anchors, 1), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(tdm.REPO / "engines" / "demo" / "target"))
    ap.add_argument("--out", default=str(tdm.REPO / "engines" / "demo" / "target-eagle3"))
    ap.add_argument("--steps", type=int, default=4, help="training-time-test depth (proposals the head is trained for)")
    ap.add_argument("--window", type=int, default=32, help="true positions the head attends to (engine's window)")
    ap.add_argument("--crop", type=int, default=96, help="positions per training crop")
    ap.add_argument("--problems", type=int, default=960, help="training problems the target answers")
    ap.add_argument("--mixed-problems", type=int, default=960,
                    help="training problems whose solutions mix in the draft's wording "
                         "(train_demo_models.mixed_voice_rows; 0: none)")
    ap.add_argument("--eval-problems", type=int, default=100)
    ap.add_argument("--minutes", type=float, default=12.0, help="time budget of the head training")
    ap.add_argument("--max-steps", type=int, default=3400, help="optimizer steps (the learning-rate schedule's length)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-size", type=int, default=32, help="crops per step")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 problems, 4 eval problems, 0.3 minutes")
    args = ap.parse_args()
    if args.quick:
        args.problems, args.eval_problems, args.minutes = 16, 4, 0.3
        args.mixed_problems = min(args.mixed_problems, 16)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model, tok = tdm.load_checkpoint(Path(args.target))
    style = tdm.tokenizer_style(tok)
    pad = tok.convert_tokens_to_ids(tdm.PAD)
    train_p = tdm.training_problems(args.problems, args.seed, "eagle3", style, random.Random(args.seed))
    eval_p = syn.generate_problems(args.eval_problems, syn.EVAL_SEED, syn.DEFAULT_DIFFICULTY, style)
    t0 = time.time()
    train_seqs = answers(model, tok, train_p, 64, "target answers (train)")
    eval_seqs = answers(model, tok, eval_p, 64, "target answers (held out)")
    gen_s = time.time() - t0
    cfg = Eagle3Head.config_for(model.config, attention_window=args.window)
    model.float()
    mixed = tdm.mixed_voice_rows(tok, args.mixed_problems, args.seed, style)
    train = features(model, tdm.answer_rows(train_seqs) + mixed, cfg.aux_layers, pad)
    held = features(model, tdm.answer_rows(eval_seqs), cfg.aux_layers, pad)
    held_mixed = features(model, tdm.mixed_voice_rows(tok, args.eval_problems, args.seed, style, eval_set=True),
                          cfg.aux_layers, pad)
    head = Eagle3Head(cfg, model.get_input_embeddings().weight, lm_head=model.get_output_embeddings().weight)
    before = chain_metrics(head, held, args.steps, args.window)
    before_mixed = chain_metrics(head, held_mixed, args.steps, args.window)

    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.max_steps, pct_start=0.05)
    step_w = [0.8 ** s for s in range(args.steps)]
    gen = torch.Generator().manual_seed(args.seed)
    t1, step, ema, stopped = time.time(), 0, None, "max-steps"
    budget = args.minutes * 60
    bar = tqdm(total=args.max_steps, desc="eagle3 head", dynamic_ncols=True, mininterval=5.0)
    while step < args.max_steps:
        feats, nxt, lab = random_crops(train, args.batch_size, args.crop, gen)
        window = int(torch.randint(1, args.window + 1, (1,), generator=gen))
        loss = 0.0
        valid = lab != -100
        unbroken = valid  # step s of the chain anchored at j - s: labels j - s .. j all valid (the target wrote them)
        for s, logits in enumerate(ttt_logits(head, feats, nxt, args.steps, window)):
            if s:
                unbroken = unbroken & torch.nn.functional.pad(valid[:, :-s], (s, 0), value=False)
            y = torch.where(unbroken, lab, -100)  # (and no anchor before the crop)
            loss = loss + step_w[s] * torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                                                        ignore_index=-100)
        loss = loss / sum(step_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.update()
        bar.set_postfix(loss=f"{ema:.3f}")
        if time.time() - t1 > budget:
            stopped = "time"
            break
    bar.close()
    train_s = time.time() - t1
    head.eval()
    after = chain_metrics(head, held, args.steps, args.window)
    after_mixed = chain_metrics(head, held_mixed, args.steps, args.window)
    out = Path(args.out)
    head.save_pretrained(out, base_model=Path(args.target).name)
    report = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "target": tdm.repo_relative(args.target),
        "aux_layers": list(cfg.aux_layers), "window": args.window, "steps": args.steps,
        "parameters": sum(p.numel() for p in params),
        "train": {"problems": args.problems, "mixed_voice_problems": args.mixed_problems, "optimizer_steps": step,
                  "crops_per_step": args.batch_size,
                  "crop": args.crop, "stopped_by": stopped, "seconds": round(train_s, 1),
                  "final_loss_ema": round(ema or 0.0, 4), "generation_seconds": round(gen_s, 1)},
        "held_out": {"problems": args.eval_problems, "seed": syn.EVAL_SEED, "untrained": before, "trained": after,
                     "mixed_voices": {"untrained": before_mixed, "trained": after_mixed}},
        "total_seconds": round(time.time() - t_start, 1),
    }
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "README.md").write_text(model_card(report))
    print(json.dumps(report["held_out"]["trained"], indent=2))


def model_card(r: dict) -> str:
    """The head's model card: what it is, how it was trained, what it reaches on held-out answers."""
    t, u, tr = r["held_out"]["trained"], r["held_out"]["untrained"], r["train"]
    mixed = mixed_figure(r["held_out"])
    rows = "\n".join(f"| {i + 1} | {u['chain_acceptance_by_depth'][i]:.3f} | {t['chain_acceptance_by_depth'][i]:.3f} |"
                     for i in range(r["steps"]))
    return f"""# EAGLE-3 draft head for the demo target

One EAGLE-3 draft layer ({r['parameters']:,} trained parameters; the target's token embedding shared, not saved) over
the features of `{r['target']}`'s layers {r['aux_layers']} (`output_hidden_states` indices: the inputs of those
decoder layers), Li et al. 2025, "EAGLE-3", section 3, with training-time test over {r['steps']} steps and attention
over at most {r['window']} past positions. Trained by self-distillation on the target's own greedy answers to
{tr['problems']} synthetic training problems, and on the task's solutions to {tr.get('mixed_voice_problems', 0)} more
with the draft's wording mixed into the context, as Lookahead Reasoning's contexts hold it (only tokens the target
writes are learned: `train_demo_models.mixed_voice_rows`) ({tr['optimizer_steps']} steps of \
{tr['crops_per_step']} crops of
{tr['crop']} positions in {tr['seconds']:.0f} s, stopped by {tr['stopped_by']}; the target's answers took
{tr['generation_seconds']:.0f} s). Layout: SafeAILab/EAGLE's EAGLE-3 checkpoint, read by vLLM (`llama_eagle3.py`) and
TensorRT-LLM (`Eagle3DecodingConfig(speculative_model_dir=...)`): `model.safetensors` (`fc`, `midlayer.*`, `norm`,
`lm_head`, `d2t`, `t2d`) and a Llama `config.json` (`LlamaForCausalLMEagle3`, `draft_vocab_size`,
`eagle_aux_hidden_state_layer_ids`). Made by:

    python {r['command']}

({r['date']}, {r['machine']}). On the target's greedy answers to {r['held_out']['problems']} held-out problems
(`synthetic.EVAL_SEED`, {t['anchors']:,} anchor positions), greedy chain acceptance at each depth:

| proposal | untrained | trained |
|---|---|---|
{rows}

Mean accepted proposals per decoding forward with {r['steps']} proposals: **{t['mean_accepted_per_forward']:.2f}**
(untrained {u['mean_accepted_per_forward']:.2f}), i.e. {t['tokens_per_forward']:.2f} tokens per target forward.
On the same held-out problems' solutions with the draft's wording mixed into the context{mixed}.
These are offline figures (the target's own answers walked in crops of 256 positions from two before the answer,
so a position sees up to the window of answer positions before it, never the prompt's); the engine's acceptance also \
depends on
the schedule, on stops and on how many positions a row has after its prefill, and is reported by
`benchmarks/lr_bench.py` (`sd [EAGLE-3, ...]` rows).
"""


if __name__ == "__main__":
    main()
