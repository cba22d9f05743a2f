#!/usr/bin/env python
"""Train Medusa heads for a target by self-distillation on its own greedy answers and on mixed-voice contexts.

Cai et al. 2024, "Medusa", section 2.2.1 (Medusa-1: the target is frozen; head ``i`` learns the token ``i + 2``
positions past each hidden state, from the target's own outputs, which section 2.3.2 recommends when the
training data's distribution differs from the model's). The heads are saved in the layout TensorRT-LLM's Medusa
conversion reads (see :mod:`lookahead_reasoning.backends.medusa`).

What it does, on the synthetic long-reasoning task of the demo trio:

1. the target answers ``--problems`` training problems greedily (seeds derived from ``--seed``, never the
   evaluation seeds), and ``--eval-problems`` held-out ones (``synthetic.EVAL_SEED``);
2. the task's solutions to ``--mixed-problems`` more problems mix the draft's wording into the target's, labelled only
   where the target writes (``train_demo_models.mixed_voice_rows``): inside
   Lookahead Reasoning the target reads contexts made mostly of accepted drafted steps, and heads trained on its
   own answers alone propose much worse there (lr_bench 2026-12-04, 100 problems: 1.99 tokens per target forward
   inside LR against 2.74 in plain decoding; 2.61 inside LR with the ``exact`` judge, whose contexts hold only
   the target's own steps);
3. one forward of the frozen target over each prompt + answer gives the last hidden states (post final norm);
4. the heads train on (hidden state, token ``i + 2`` ahead) for every position whose next two tokens the target
   writes, loss weighted ``0.8 ** i`` per head as in the paper's training recipe, for ``--minutes`` at most;
5. top-1 accuracy per head and the chain acceptance the engine would see (head ``i``'s proposal counts only
   when heads ``0..i-1`` were right, and the base head's token is always kept) are measured on the held-out
   answers, and on held-out mixed-voice answers, and written to ``<out>/eval.json``.

Usage::

    python build_scripts/train_medusa_heads.py --target engines/demo/target --out engines/demo/target-medusa
    python build_scripts/train_medusa_heads.py --target engines/demo/target --out /tmp/medusa --quick   # ~1 min
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
from lookahead_reasoning.backends.medusa import MedusaHeads  # noqa: E402

syn = tdm.syn


def answers(model, tok, problems, batch_size: int, desc: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy answer ids up to and including EOS) per problem."""
    prompts = [tdm.chat_prompt_ids(tok, p.question) for p in problems]
    eos, pad = tok.convert_tokens_to_ids(tdm.EOS), tok.convert_tokens_to_ids(tdm.PAD)
    outs = tdm.greedy_generate(model, prompts, pad, [eos], tdm.MAX_ANSWER_TOKENS[problems[0].style], batch_size, desc)
    return list(zip(prompts, outs, strict=False))


@torch.inference_mode()
def features(model, rows: list[tuple[list[int], list[int]]], pad: int, batch_size: int = 16
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Training pairs from the frozen target: ``hidden [N, H]`` float32 at every position ``t`` whose next two
    tokens are labelled (the target writes them: the engine proposes from ``t`` once it has committed ``t + 1``),
    and ``ahead [N, HEAD_CAP]`` int64, the tokens ``t + 2, t + 3, ...`` while every token from ``t + 1`` on is
    labelled (-100 from the first unlabelled one, and past the end). Position ``t`` is the one whose base head
    predicts token ``t + 1``.

    Args:
        rows: ``(ids, labels)`` per sequence, labels -100 where the target does not write the token
            (``train_demo_models.answer_rows`` / ``mixed_voice_rows``).
    """
    hs, ys = [], []
    decoder = model.get_decoder()
    for s in range(0, len(rows), batch_size):
        chunk = rows[s: s + batch_size]
        ids_t, _ = tdm.pad_batch([(x, x) for x, _ in chunk], pad)
        hidden = decoder(input_ids=ids_t).last_hidden_state.float()
        for r, (ids, labels) in enumerate(chunk):
            lab = torch.tensor(labels + [-100] * (HEAD_CAP + 1))
            pos = torch.tensor([t for t in range(len(ids) - 2) if labels[t + 1] != -100 and labels[t + 2] != -100],
                               dtype=torch.long)
            window = lab[pos[:, None] + 1 + torch.arange(HEAD_CAP + 1)[None]]  # tokens t + 1 .. t + 1 + HEAD_CAP
            unbroken = (window != -100).long().cumprod(dim=1).bool()  # labelled from t + 1 on, without a gap
            hs.append(hidden[r, pos])
            ys.append(torch.where(unbroken[:, 1:], window[:, 1:], -100))
    return torch.cat(hs), torch.cat(ys)


HEAD_CAP = 8  # most heads this script trains


def chain_metrics(heads: MedusaHeads, hidden: torch.Tensor, ahead: torch.Tensor) -> dict:
    """Per-head top-1 accuracy and the greedy chain's acceptance at each depth (head ``i`` accepted only if
    heads ``0..i-1`` were), and the mean accepted proposals per decoding forward with all heads proposing."""
    with torch.inference_mode():
        pred = heads(hidden).argmax(-1).T  # [N, k]
    k = heads.num_heads
    y = ahead[:, :k]
    valid = y != -100
    hit = (pred == y) & valid
    chain = hit.long().cumprod(dim=1)  # [N, k]: heads 0..i all right
    reached = torch.cat([valid[:, :1].long(), chain[:, :-1]], dim=1)  # heads 0..i-1 right (depth i reached)
    return {
        "positions": int(hidden.shape[0]),
        "top1_by_head": [round(float(hit[:, i].sum() / valid[:, i].sum()), 4) for i in range(k)],
        "chain_acceptance_by_depth": [round(float(chain[:, i].sum() / reached[:, i].sum().clamp(min=1)), 4)
                                      for i in range(k)],
        "mean_accepted_per_forward": round(float(chain.sum(1).float().mean()), 3),
        "tokens_per_forward": round(1 + float(chain.sum(1).float().mean()), 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(tdm.REPO / "engines" / "demo" / "target"))
    ap.add_argument("--out", default=str(tdm.REPO / "engines" / "demo" / "target-medusa"))
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1, help="residual blocks per head")
    ap.add_argument("--problems", type=int, default=960, help="training problems the target answers")
    ap.add_argument("--mixed-problems", type=int, default=960,
                    help="training problems whose solutions mix in the draft's wording "
                         "(train_demo_models.mixed_voice_rows; 0: none)")
    ap.add_argument("--eval-problems", type=int, default=100)
    ap.add_argument("--minutes", type=float, default=10.0, help="time budget of the head training")
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-size", type=int, default=1024, help="positions per step")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 problems, 4 eval problems, 0.3 minutes")
    args = ap.parse_args()
    if not 1 <= args.heads <= HEAD_CAP:
        raise SystemExit(f"--heads: must be 1..{HEAD_CAP}")
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
    train_p = tdm.training_problems(args.problems, args.seed, "medusa", style, random.Random(args.seed))
    eval_p = syn.generate_problems(args.eval_problems, syn.EVAL_SEED, syn.DEFAULT_DIFFICULTY, style)
    t0 = time.time()
    train_seqs = answers(model, tok, train_p, 64, "target answers (train)")
    eval_seqs = answers(model, tok, eval_p, 64, "target answers (held out)")
    gen_s = time.time() - t0
    mixed = tdm.mixed_voice_rows(tok, args.mixed_problems, args.seed, style)
    hidden, ahead = features(model, tdm.answer_rows(train_seqs) + mixed, pad)
    ev_hidden, ev_ahead = features(model, tdm.answer_rows(eval_seqs), pad)
    ev_mixed = features(model, tdm.mixed_voice_rows(tok, args.eval_problems, args.seed, style, eval_set=True), pad)
    lm_head = model.get_output_embeddings().weight.detach().float()
    heads = MedusaHeads(hidden.shape[1], lm_head.shape[0], args.heads, args.layers, lm_head=lm_head)
    before = chain_metrics(heads, ev_hidden, ev_ahead)
    before_mixed = chain_metrics(heads, *ev_mixed)

    opt = torch.optim.AdamW(heads.parameters(), lr=args.lr, weight_decay=0.0)
    n = hidden.shape[0]
    steps_per_epoch = -(-n // args.batch_size)
    total = steps_per_epoch * args.epochs
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=total, pct_start=0.05)
    head_w = torch.tensor([0.8 ** i for i in range(args.heads)])
    t1, step, ema = time.time(), 0, None
    budget = args.minutes * 60
    bar = tqdm(total=total, desc="medusa heads", dynamic_ncols=True, mininterval=5.0)
    stopped = "epochs"
    for _ in range(args.epochs):
        perm = torch.randperm(n)
        for s in range(0, n, args.batch_size):
            idx = perm[s: s + args.batch_size]
            logits = heads(hidden[idx])  # [k, B, V]
            y = ahead[idx, : args.heads].T  # [k, B]
            loss_k = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100,
                                                       reduction="none").view(args.heads, -1)
            mask = (y != -100).float()
            loss = ((loss_k * mask).sum(1) / mask.sum(1).clamp(min=1) * head_w).sum() / head_w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            value = loss.item()
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            bar.update()
            bar.set_postfix(loss=f"{ema:.3f}")
            if time.time() - t1 > budget:
                stopped = "time"
                break
        if stopped == "time":
            break
    bar.close()
    train_s = time.time() - t1
    heads.eval()
    after = chain_metrics(heads, ev_hidden, ev_ahead)
    after_mixed = chain_metrics(heads, *ev_mixed)
    out = Path(args.out)
    heads.save_pretrained(out, base_model=Path(args.target).name)
    report = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "target": tdm.repo_relative(args.target),
        "heads": args.heads, "layers": args.layers,
        "parameters": sum(p.numel() for p in heads.parameters()),
        "train": {"problems": args.problems, "mixed_voice_problems": args.mixed_problems, "positions": n,
                  "steps": step, "stopped_by": stopped,
                  "seconds": round(train_s, 1), "final_loss_ema": round(ema or 0.0, 4),
                  "generation_seconds": round(gen_s, 1)},
        "held_out": {"problems": args.eval_problems, "seed": syn.EVAL_SEED, "untrained": before, "trained": after,
                     "mixed_voices": {"untrained": before_mixed, "trained": after_mixed}},
        "total_seconds": round(time.time() - t_start, 1),
    }
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "README.md").write_text(model_card(report))
    print(json.dumps(report["held_out"]["trained"], indent=2))


def mixed_figure(held_out: dict) -> str:
    """The cards' clause on held-out mixed-voice contexts (``held_out["mixed_voices"]``: chain metrics untrained and
    trained), or that they were not measured (a report from before they were)."""
    mx = held_out.get("mixed_voices")
    return (f": {mx['trained']['tokens_per_forward']:.2f} tokens per target forward "
            f"(untrained {mx['untrained']['tokens_per_forward']:.2f})") if mx else ": not measured"


def model_card(r: dict) -> str:
    """The heads' model card: what they are, how they were trained, what they reach on held-out answers."""
    t, u, tr = r["held_out"]["trained"], r["held_out"]["untrained"], r["train"]
    mixed = mixed_figure(r["held_out"])
    rows = "\n".join(f"| {i} (token t+{i + 2}) | {u['top1_by_head'][i]:.3f} | {t['top1_by_head'][i]:.3f} | "
                     f"{t['chain_acceptance_by_depth'][i]:.3f} |" for i in range(r["heads"]))
    return f"""# Medusa heads for the demo target

{r['heads']} Medusa heads ({r['layers']} residual block each, {r['parameters']:,} parameters) on the last hidden state
of `{r['target']}` (Cai et al. 2024, "Medusa", section 2.1.1; Medusa-1: the target frozen), trained by
self-distillation on the target's own greedy answers to {tr['problems']} synthetic training problems, and on the
task's solutions to {tr.get('mixed_voice_problems', 0)} more with the draft's wording mixed into the context, as
Lookahead Reasoning's contexts hold it (only tokens the target writes are learned: `train_demo_models.mixed_voice_rows`)
({tr['positions']:,} positions,
{tr['steps']} steps in {tr['seconds']:.0f} s, stopped by {tr['stopped_by']}; the target's answers took \
{tr['generation_seconds']:.0f} s). Layout: FasterDecoding/Medusa's, which TensorRT-LLM's
Medusa conversion reads (`medusa_lm_head.safetensors`, `config.json` with `medusa_num_heads` /
`medusa_num_layers`). Made by:

    python {r['command']}

({r['date']}, {r['machine']}). On the target's greedy answers to {r['held_out']['problems']} held-out problems
(`synthetic.EVAL_SEED`, {t['positions']:,} positions):

| head | top-1 accuracy, untrained (= the base head's next token) | top-1 accuracy, trained \
| chain acceptance at this depth |
|---|---|---|---|
{rows}

Mean accepted proposals per decoding forward with all heads proposing (greedy chain): \
**{t['mean_accepted_per_forward']:.2f}**
(untrained {u['mean_accepted_per_forward']:.2f}), i.e. {t['tokens_per_forward']:.2f} tokens per target forward.
On the same held-out problems' solutions with the draft's wording mixed into the context{mixed}.
These are offline figures; the engine's acceptance also depends on the schedule and
on stops, and is reported by `benchmarks/lr_bench.py` (`sd [Medusa, ...]` rows).
"""


if __name__ == "__main__":
    main()
