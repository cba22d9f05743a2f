"""`ar` speed and answer quality of one profile's target in float32 against `dtype: auto` (issue 18, item 3).

Two target engines of the same checkpoint, one pinned to float32 and one with `dtype: auto` (bfloat16 where the
CPU has native bf16 matmul and the start-up micro-benchmark finds it faster), each in its own worker process:
torch's OpenMP pool belongs to one thread per process, and two multi-threaded engines in one process slow each
other down (see lookahead_reasoning.backends.portable). Both run in the same benchmark run: each question is
answered greedily by both, in an order that alternates per question, after one untimed warm-up question.
Reported: the dtype `auto` chose and why, tokens/s of each (total generated tokens / total seconds), the ratio
with a 95% paired-bootstrap interval over questions, how many final answers agree (GSM8K: the extracted number;
other sets: the exact text) and how many are correct in each dtype.

Usage: python benchmarks/dtype_bench.py --profile smollm2 --dataset gsm8k --limit 100 [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
from datetime import date
from pathlib import Path

from tqdm import tqdm

from lookahead_reasoning.evaluation.answers import check_answer, extract_gsm8k
from lookahead_reasoning.evaluation.runner import (bootstrap_speedup_ci, load_average, load_with_spare, measurement_block,
                                                   uses_chat_template)


def final_answer(kind: str, text: str) -> str:
    """What "the same final answer" compares: GSM8K's extracted number, else the whole text."""
    if kind == "gsm8k":
        value = extract_gsm8k(text)
        return "none" if value is None else repr(value)
    return text


def _worker(conn, profile_name: str, config: str | None, dtype: str, max_tokens: int | None) -> None:
    """One target engine in its own process: answers ``(prompt, messages)`` with ``(text, tokens, seconds)``."""
    import time

    from lookahead_reasoning.backends import make_engine
    from lookahead_reasoning.core.lookahead import LookaheadReasoner
    from lookahead_reasoning.profiles import load_profile

    profile = load_profile(profile_name, config)
    engine = make_engine(profile.target.model_copy(update={"dtype": dtype}))
    reasoner = LookaheadReasoner(engine, None, None, defaults=profile.options)
    opts = profile.options.model_copy(update={"mode": "ar", **({"max_tokens": max_tokens} if max_tokens else {})})
    choice = engine.dtype_choice
    conn.send({"dtype": choice.dtype, "reason": choice.reason, "ms_per_step": choice.ms_per_step,
               "chat": uses_chat_template(reasoner)})
    while (msg := conn.recv()) is not None:
        t0 = time.perf_counter()
        res = reasoner.run(*msg, options=opts)
        conn.send((res.text, len(res.token_ids), time.perf_counter() - t0))
    engine.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2")
    ap.add_argument("--config", default=None)
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=None, help="default: the profile's max_tokens")
    ap.add_argument("--out", default="benchmarks/out/dtype_bench.json")
    args = ap.parse_args(argv)

    load_start = load_average()
    items, spare = load_with_spare(args.dataset, args.limit)
    ctx = mp.get_context("spawn")
    names = ["float32", "auto"]
    conns, procs, info = {}, [], {}
    for name in names:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, args.profile, args.config, name, args.max_tokens), daemon=True)
        p.start()
        conns[name], info[name] = parent, parent.recv()
        procs.append(p)
    chat = info["auto"]["chat"]
    per = {k: {"tokens": [], "seconds": [], "answers": [], "correct": []} for k in names}
    try:
        for name in names:  # warm-up, untimed
            conns[name].send((spare or items[0]).request(chat))
            conns[name].recv()
        for i, item in enumerate(tqdm(items, desc="dtype_bench", unit="q", file=sys.stderr)):
            for name in (names if i % 2 == 0 else names[::-1]):
                conns[name].send(item.request(chat))
                text, tokens, seconds = conns[name].recv()
                per[name]["seconds"].append(seconds)
                per[name]["tokens"].append(tokens)
                per[name]["answers"].append(final_answer(item.kind, text))
                per[name]["correct"].append(check_answer(item, text))
    finally:
        for name in names:
            conns[name].send(None)
        for p in procs:
            p.join(timeout=30)
    tps = {k: sum(v["tokens"]) / sum(v["seconds"]) for k, v in per.items()}
    ratio = tps["auto"] / tps["float32"]
    ci = bootstrap_speedup_ci(per["auto"]["tokens"], per["auto"]["seconds"],
                              per["float32"]["tokens"], per["float32"]["seconds"])
    same = sum(a == b for a, b in zip(per["auto"]["answers"], per["float32"]["answers"]))
    choice = info["auto"]
    doc = {"date": date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor()}".strip(),
           "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])), "profile": args.profile,
           "dataset": args.dataset, "n": len(items),
           "auto_choice": {k: choice[k] for k in ("dtype", "reason", "ms_per_step")},
           "tokens_per_s": tps, "auto_over_float32": ratio, "auto_over_float32_ci95": ci,
           "same_final_answer": same,
           "correct": {k: sum(bool(c) for c in v["correct"]) for k, v in per.items()},
           "measurement": measurement_block(load_start, order="alternating per question", warmup_requests=1,
                                            processes="one worker process per dtype"),
           "per_question": {k: {"tokens": v["tokens"], "seconds": v["seconds"]} for k, v in per.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"auto chose {choice['dtype']} ({choice['reason']})")
    print("| dtype | tok/s | correct |\n|---|---|---|")
    for k in names:
        label = f"auto ({choice['dtype']})" if k == "auto" else k
        print(f"| {label} | {tps[k]:.1f} | {doc['correct'][k]}/{len(items)} |")
    m = doc["measurement"]
    print(f"auto / float32 = {ratio:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]; same final answer {same}/{len(items)}; "
          f"load {m['load_avg_1min_start']} -> {m['load_avg_1min_end']}"
          + (f"; WARNING: {m['warning']}" if m.get("warning") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
