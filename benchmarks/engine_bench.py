"""Portable-engine benchmark on the demo target (CPU by default).

Measures, and prints as a table (JSON with --out):
1. batch-1 decode tokens/s of the engine vs plain ``model.generate`` (same checkpoint, greedy, same prompts);
2. ``b(n)``: the time of one decoding step (one new token for each of n sequences sharing a 200-token prefix)
   relative to n = 1, for n = 1..8 (median over steps);
3. prefix-cache share over a 10-cycle Lookahead-Reasoning-like access pattern (each cycle submits gamma + 1
   branches ``x, x + d0, x + d0 + d1, ...``; ``x`` grows by one step per cycle): tokens computed for prefixes
   that had been seen before, relative to their length (goal <= 5%);
4. n-gram SD (6 speculative tokens, prompt_lookup_max 2) speedup and acceptance on generated solutions.

Usage: python benchmarks/engine_bench.py [--model engines/demo/target] [--threads 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from lookahead_reasoning.backends.base import GenerationRequest, SpecDecodeConfig
from lookahead_reasoning.backends.portable import PortableEngine
from lookahead_reasoning.evaluation.synthetic import EVAL_SEED, generate_problems


def prompts(engine, n):
    return [engine.apply_chat_template([{"role": "user", "content": p.question}])
            for p in generate_problems(n, EVAL_SEED + 17)]


def bench_vs_generate(engine, model_dir, ps, max_new, repeats=2):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = sorted(engine.eos_token_ids)
    best_hf = best_eng = float("inf")
    tokens_hf = tokens_eng = 0
    for _ in range(repeats):
        t0, tokens_hf = time.perf_counter(), 0
        with torch.inference_mode():
            for p in ps:
                out = model.generate(torch.tensor([p]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                                     pad_token_id=engine.tokenizer.pad_token_id)
                tokens_hf += out.shape[1] - len(p)
        best_hf = min(best_hf, time.perf_counter() - t0)
        engine.reset_prefix_cache()
        t0, tokens_eng = time.perf_counter(), 0
        for p in ps:
            tokens_eng += len(engine.generate([GenerationRequest(p, max_new)])[0].token_ids)
        best_eng = min(best_eng, time.perf_counter() - t0)
    return {"hf_tokens_per_s": tokens_hf / best_hf, "engine_tokens_per_s": tokens_eng / best_eng,
            "ratio": (tokens_eng / best_eng) / (tokens_hf / best_hf), "tokens": tokens_eng}


def bench_b(engine, prefix, ns=range(1, 9), steps=24):
    engine.record_steps = True
    out = {}
    for n in ns:
        engine.step_seconds.clear()
        engine.generate([GenerationRequest(prefix + [prefix[-1 - i]], steps) for i in range(n)])
        rows = sorted(s for b, w, s in engine.step_seconds if b == n and w == 1)[2:]
        out[n] = statistics.median(rows)
    engine.record_steps = False
    return {str(n): out[n] / out[1] for n in out} | {"step_ms_n1": 1e3 * out[1]}


def bench_prefix_cache(engine, problem, gamma=4, cycles=10):
    """LR-like pattern; returns the share of previously seen prefix tokens that were recomputed."""
    engine.reset_prefix_cache()
    steps = [engine.encode(s + "\n\n") for s in problem.steps] * 4
    x = engine.apply_chat_template([{"role": "user", "content": problem.question}])
    seen: set[tuple] = set()
    repeated = computed_repeated = 0
    for c in range(cycles):
        branches = []
        for j in range(gamma + 1):
            branches.append(x + [t for s in steps[c:c + j] for t in s])
        results = engine.generate([GenerationRequest(b, 4) for b in branches])
        for b, r in zip(branches, results, strict=False):
            # Longest prefix of this prompt seen before (in earlier cycles or earlier branches).
            known = max((k for k in range(len(b) - 1, 0, -1) if tuple(b[:k]) in seen), default=0)
            new = (len(b) - 1) - known
            repeated += known
            computed_repeated += max(0, r.counters.prefill_tokens_computed - 1 - new)
        for b in branches:
            for k in range(1, len(b)):
                seen.add(tuple(b[:k]))
        x = x + steps[c]
    return {"repeated_prefix_tokens": repeated, "recomputed_tokens": computed_repeated,
            "recomputed_share": computed_repeated / repeated if repeated else 0.0}


def bench_ngram(engine, ps, max_new):
    spec = SpecDecodeConfig(method="ngram", num_speculative_tokens=6, prompt_lookup_max=2)
    res = {}
    for name, s in (("plain", SpecDecodeConfig()), ("ngram", spec)):
        engine.reset_prefix_cache()
        t0 = time.perf_counter()
        rs = [engine.generate([GenerationRequest(p, max_new, spec=s)])[0] for p in ps]
        res[name] = (time.perf_counter() - t0, rs)
    (tp, plain), (tn, ngram) = res["plain"], res["ngram"]
    same = all(a.token_ids == b.token_ids for a, b in zip(plain, ngram, strict=False))
    drafted = sum(r.counters.drafted_tokens for r in ngram)
    accepted = sum(r.counters.accepted_tokens for r in ngram)
    tokens = sum(len(r.token_ids) for r in ngram)
    forwards = sum(r.counters.forward_passes for r in ngram)
    return {"speedup": tp / tn, "acceptance": accepted / drafted if drafted else None,
            "tokens_per_forward": tokens / forwards, "identical_output": same}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "engines" / "demo" / "target"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = PortableEngine.from_pretrained(args.model, num_threads=args.threads)
    ps = prompts(engine, args.problems)
    engine.generate([GenerationRequest(ps[0], 8)])  # warm-up
    report = {"model": args.model, "threads": args.threads, "torch": torch.__version__}
    report["batch1_vs_generate"] = bench_vs_generate(engine, args.model, ps, args.max_new)
    prefix = (ps[0] * 10)[:200]
    report["b_of_n"] = bench_b(engine, prefix)
    report["prefix_cache_lr_pattern"] = bench_prefix_cache(engine,
                                                           generate_problems(1, EVAL_SEED + 99, difficulty=4)[0])
    report["ngram_sd"] = bench_ngram(engine, ps, args.max_new)
    engine.close()
    v, b, pc, ng = (report[k] for k in ("batch1_vs_generate", "b_of_n", "prefix_cache_lr_pattern", "ngram_sd"))
    print(f"engine {args.model} (threads={args.threads}, torch {torch.__version__})")
    print(f"  batch-1 decode: engine {v['engine_tokens_per_s']:.1f} tok/s vs model.generate "
          f"{v['hf_tokens_per_s']:.1f} tok/s -> {v['ratio']:.2f}x  (goal >= 1.0x)")
    print("  b(n), one decoding step, 200-token shared prefix: "
          + "  ".join(f"b({n})={b[str(n)]:.2f}" for n in range(1, 9)) + f"  [n=1: {b['step_ms_n1']:.2f} ms]"
          + "  (goal b(5) <= 1.6)")
    print(f"  prefix cache, 10-cycle LR pattern: recomputed {pc['recomputed_tokens']} of "
          f"{pc['repeated_prefix_tokens']} repeated prefix tokens = {100 * pc['recomputed_share']:.1f}%  (goal <= 5%)")
    acc = "n/a" if ng["acceptance"] is None else f"{ng['acceptance']:.2f}"
    print(f"  n-gram SD (k=6, lookup<=2): speedup {ng['speedup']:.2f}x, acceptance {acc}, "
          f"{ng['tokens_per_forward']:.2f} tokens/forward, identical output: {ng['identical_output']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
