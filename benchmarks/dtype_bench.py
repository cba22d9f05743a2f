"""`ar` speed and answer quality of one profile's target in several variants: dtypes of the portable engine and the
llama.cpp runtime (issue 18 item 3: float32 against `dtype: auto`; issue 24: llama.cpp against the portable engine).

Variants (``--variants``, the first is the baseline of every ratio):

* ``float32`` / ``bfloat16`` / ``auto``: the portable engine with that ``dtype`` (``auto``: bfloat16 where the CPU has
  native bf16 matmul and the start-up micro-benchmark finds it faster);
* ``llamacpp``: the llama.cpp runtime on the target's GGUF file as stored (the profile's target path must be a GGUF);
* ``llamacpp-sd``: the same engine in mode ``sd`` (our n-gram SD, the profile's ``target_spec``);
* ``llama-cpp-python`` / ``llama-cpp-python-pld``: llama-cpp-python's own ``Llama.create_completion`` on the same
  GGUF and the same prompt ids, greedy (``temperature=0``, ``repeat_penalty=1``), without a draft and with its
  prompt-lookup decoding (``LlamaPromptLookupDecoding`` with the profile's ``prompt_lookup_max`` and
  ``num_speculative_tokens``): the reference for the scheduler's per-token overhead and for our n-gram SD.

Each variant's engine lives in its own worker process: torch's OpenMP pool belongs to one thread per process, and
two multi-threaded engines in one process slow each other down (see lookahead_reasoning.backends.portable). All
run in the same benchmark run: each question is answered greedily by every variant, in an order rotated per
question, after one untimed warm-up question. Then, in the same run, ``b(n)``: ``n`` greedy requests with one
``--bn-context``-token prompt decoded together, the engine's own per-step timings (``record_steps``: one batched
forward plus the engine's bookkeeping per step) of the steps with ``n`` rows, relative to one row; ``--bn-repeats``
rounds, each over every (variant, n) pair in a freshly shuffled order, medians.

Reported: each variant's dtype (our llama.cpp engine: the GGUF's weight type; llama-cpp-python: "GGUF weights as
stored", the same file), tokens/s (total generated tokens / total seconds of whole requests, prefill included), the
ratio to the baseline with a 95% paired-bootstrap interval over questions (it collapses to one value with one
question), how many final answers agree with the baseline's (GSM8K: the extracted number; other sets: the exact
text), how many are correct, the one-row decoding step time in ms at the b(n) prompt's context (one decode call,
not a whole request, so it is not 1000 / tok/s) and b(2), b(3), b(5) (step time with n rows / with one row, a
ratio). The llama-cpp-python variants have no per-step timings: "-" there. The last line is the 1-minute load
average at the start and the end, with a warning when the start was busy.

Usage: python benchmarks/dtype_bench.py --profile smollm2 --dataset gsm8k --limit 100 [--variants float32,auto]
       [--max-tokens N] [--rows 2,3,5] [--bn-context 300] [--bn-steps 24] [--bn-repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import random
import statistics
import sys
from datetime import date
from pathlib import Path

from lookahead_reasoning.evaluation.answers import check_answer, extract_gsm8k
from lookahead_reasoning.evaluation.runner import (
    bootstrap_speedup_ci,
    load_average,
    load_with_spare,
    measurement_block,
    uses_chat_template,
)
from tqdm import tqdm

# variant -> (ModelSpec update, mode); None: llama-cpp-python itself, no engine of ours
VARIANTS = {"float32": ({"dtype": "float32"}, "ar"), "bfloat16": ({"dtype": "bfloat16"}, "ar"),
            "auto": ({"dtype": "auto"}, "ar"), "llamacpp": ({"runtime": "llamacpp"}, "ar"),
            "llamacpp-sd": ({"runtime": "llamacpp"}, "sd"), "llama-cpp-python": None, "llama-cpp-python-pld": None}


def final_answer(kind: str, text: str) -> str:
    """What "the same final answer" compares: GSM8K's extracted number, else the whole text."""
    if kind == "gsm8k":
        value = extract_gsm8k(text)
        return "none" if value is None else repr(value)
    return text


def _worker(conn, profile_name: str, config: str | None, variant: str, max_tokens: int | None) -> None:
    """One target engine in its own process. Messages: ``("ask", (prompt, messages))`` -> ``(text, tokens, seconds)``;
    ``("bn", prompt_ids, n, steps)`` -> seconds of each decoding step with ``n`` rows and one position per row."""
    import time

    from lookahead_reasoning.backends import make_engine
    from lookahead_reasoning.backends.base import GenerationRequest
    from lookahead_reasoning.core.lookahead import LookaheadReasoner
    from lookahead_reasoning.profiles import load_profile
    from lookahead_reasoning.serving.triton_role import engine_dtype

    profile = load_profile(profile_name, config)
    if VARIANTS[variant] is None:
        return _plain_worker(conn, profile, variant, max_tokens or profile.options.max_tokens)
    update, mode = VARIANTS[variant]
    engine = make_engine(profile.target.model_copy(update=update))
    reasoner = LookaheadReasoner(engine, None, None, defaults=profile.options)
    opts = profile.options.model_copy(update={"mode": mode, **({"max_tokens": max_tokens} if max_tokens else {})})
    choice = getattr(engine, "dtype_choice", None)
    conn.send({"dtype": engine_dtype(engine), "reason": choice.reason if choice else "GGUF weights as stored",
               "chat": uses_chat_template(reasoner), "runtime": engine.name})
    while (msg := conn.recv()) is not None:
        if msg[0] == "ask":
            t0 = time.perf_counter()
            res = reasoner.run(*msg[1], options=opts)
            conn.send((res.text, len(res.token_ids), time.perf_counter() - t0))
        else:
            _, prompt, n, steps = msg
            engine.step_seconds.clear()
            engine.record_steps = True
            try:
                engine.generate([GenerationRequest(prompt, steps) for _ in range(n)])
            finally:
                engine.record_steps = False
            conn.send([s for rows, width, s in engine.step_seconds if rows == n and width == 1])
    engine.close()


def _plain_worker(conn, profile, variant: str, max_tokens: int) -> None:
    """llama-cpp-python's ``Llama`` in this process, with the messages of :func:`_worker` (no ``bn``)."""
    import time

    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    from lookahead_reasoning.backends.tokenizer import TokenizerAccess
    from transformers import AutoTokenizer

    spec, sd = profile.target, profile.options.target_spec
    tok = TokenizerAccess()  # the prompt ids our engines build
    tok.tokenizer = AutoTokenizer.from_pretrained(spec.resolved_path())
    chat = bool(getattr(tok.tokenizer, "chat_template", None))
    draft = (LlamaPromptLookupDecoding(max_ngram_size=sd.prompt_lookup_max, num_pred_tokens=sd.num_speculative_tokens)
             if variant.endswith("-pld") else None)
    llm = Llama(str(spec.located_path()), n_ctx=4096, n_threads=spec.num_threads, n_threads_batch=spec.num_threads,
                draft_model=draft, verbose=False)
    conn.send({"dtype": "GGUF weights as stored", "reason": "llama-cpp-python", "chat": chat,
               "runtime": "llama-cpp-python" + (" + prompt lookup" if draft else "")})
    while (msg := conn.recv()) is not None:
        if msg[0] != "ask":
            conn.send([])
            continue
        prompt, messages = msg[1]
        ids = tok.apply_chat_template(messages or [{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
        t0 = time.perf_counter()
        out = llm.create_completion(list(ids), max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.0)
        conn.send((out["choices"][0]["text"], out["usage"]["completion_tokens"], time.perf_counter() - t0))
    llm.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smollm2")
    ap.add_argument("--config", default=None)
    ap.add_argument("--dataset", default="gsm8k")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=None, help="default: the profile's max_tokens")
    ap.add_argument("--variants", default="float32,auto", help=f"comma-separated, from {', '.join(VARIANTS)}")
    ap.add_argument("--rows", default="2,3,5", help="b(n) row counts ('' skips b(n))")
    ap.add_argument("--bn-context", type=int, default=300, help="b(n) prompt length, tokens")
    ap.add_argument("--bn-steps", type=int, default=24, help="decoding steps per b(n) trial")
    ap.add_argument("--bn-repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/out/dtype_bench.json")
    args = ap.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS] or ([] if len(set(names)) == len(names) >= 2 else names)
    if bad:
        ap.error(f"--variants: two or more distinct names from {', '.join(VARIANTS)}, got {args.variants!r}")
    rows = [int(x) for x in args.rows.split(",") if x.strip()]

    load_start = load_average()
    items, spare = load_with_spare(args.dataset, args.limit)
    ctx = mp.get_context("spawn")
    conns, procs, info = {}, [], {}
    for name in names:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(child, args.profile, args.config, name, args.max_tokens), daemon=True)
        p.start()
        child.close()  # a worker that dies closes the pipe: recv() raises EOFError instead of waiting forever
        conns[name], info[name] = parent, parent.recv()
        procs.append(p)
    chat = info[names[0]]["chat"]
    per = {k: {"tokens": [], "seconds": [], "answers": [], "correct": []} for k in names}
    steps: dict[str, dict[int, list[float]]] = {k: {n: [] for n in [1] + rows} for k in names}
    try:
        for name in names:  # warm-up, untimed
            conns[name].send(("ask", (spare or items[0]).request(chat)))
            conns[name].recv()
        for i, item in enumerate(tqdm(items, desc="dtype_bench", unit="q", file=sys.stderr)):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                conns[name].send(("ask", item.request(chat)))
                text, tokens, seconds = conns[name].recv()
                per[name]["seconds"].append(seconds)
                per[name]["tokens"].append(tokens)
                per[name]["answers"].append(final_answer(item.kind, text))
                per[name]["correct"].append(check_answer(item, text))
        if rows:
            rng = random.Random(0)
            text = " ".join(it.prompt or it.messages[-1]["content"] for it in items)
            from lookahead_reasoning.profiles import load_profile
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(load_profile(args.profile, args.config).target.resolved_path())
            prompt = tok.encode(text, add_special_tokens=False)[: args.bn_context]
            pairs = [(name, n) for name in names if VARIANTS[name] is not None for n in [1] + rows]
            for name, n in pairs:  # warm-up, untimed
                conns[name].send(("bn", prompt, n, 4))
                conns[name].recv()
            for _ in range(args.bn_repeats):
                rng.shuffle(pairs)
                for name, n in pairs:
                    conns[name].send(("bn", prompt, n, args.bn_steps))
                    got = conns[name].recv()[2:]  # the first steps of a trial warm caches
                    if got:
                        steps[name][n].append(statistics.median(got))
    finally:
        for name in names:
            conns[name].send(None)
        for p in procs:
            p.join(timeout=30)
    base = names[0]
    tps = {k: sum(v["tokens"]) / sum(v["seconds"]) for k, v in per.items()}
    ratio = {k: tps[k] / tps[base] for k in names}
    ci = {k: bootstrap_speedup_ci(per[k]["tokens"], per[k]["seconds"], per[base]["tokens"], per[base]["seconds"])
          for k in names if k != base}
    same = {k: sum(a == b for a, b in zip(per[k]["answers"], per[base]["answers"], strict=False)) for k in names}
    step_ms = {k: {n: (1000 * statistics.median(v) if v else None) for n, v in steps[k].items()} for k in names}
    b = {k: {n: (step_ms[k][n] / step_ms[k][1] if step_ms[k][n] and step_ms[k][1] else None) for n in rows}
         for k in names}
    doc = {"date": date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor()}".strip(),
           "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])), "profile": args.profile,
           "dataset": args.dataset, "n": len(items), "variants": names, "baseline": base,
           "info": {k: {f: info[k][f] for f in ("dtype", "reason", "runtime")} for k in names},
           "tokens_per_s": tps, "over_baseline": ratio, "over_baseline_ci95": ci, "same_final_answer": same,
           "correct": {k: sum(bool(c) for c in v["correct"]) for k, v in per.items()},
           "step_ms": step_ms, "b": b,
           "measurement": measurement_block(load_start, order="rotated per question", warmup_requests=1,
                                            processes="one worker process per variant",
                                            b_n=f"{args.bn_context}-token prompt, {args.bn_steps} steps per trial, "
                                                f"{args.bn_repeats} shuffled rounds, medians"),
           "per_question": {k: {"tokens": v["tokens"], "seconds": v["seconds"]} for k, v in per.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    head = "| variant | runtime | dtype | tok/s | vs " + base + " [95%] | same answer | correct | ms/step (1 row)"
    head += "".join(f" | b({n})" for n in rows) + " |"
    print(head + "\n|" + "---|" * (8 + len(rows)))
    for k in names:
        r = f"{ratio[k]:.2f}" + (f" [{ci[k][0]:.2f}, {ci[k][1]:.2f}]" if ci.get(k) else "")
        ms = step_ms[k][1]
        print(f"| {k} | {info[k]['runtime']} | {info[k]['dtype']} | {tps[k]:.1f} | {r} | {same[k]}/{len(items)} | "
              f"{doc['correct'][k]}/{len(items)} | {'-' if ms is None else f'{ms:.2f}'}"
              + "".join(f" | {'-' if b[k][n] is None else f'{b[k][n]:.2f}'}" for n in rows) + " |")
    m = doc["measurement"]
    print(f"load {m['load_avg_1min_start']} -> {m['load_avg_1min_end']}"
          + (f"; WARNING: {m['warning']}" if m.get("warning") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
