"""GPU benchmark of the portable engine (run by benchmarks/gpu_bench.sh on one GPU, <= 5 minutes).

Measures and writes a markdown table (``--out``):
1. ms per decoding step, random-weight Qwen3-1.7B and Qwen3-32B shapes (bf16), batch 1 and 4, context 512:
   plain transformers ``generate`` (eager, DynamicCache), transformers' static cache
   (``cache_implementation="static"``, compiled by the library), and this engine in GPU mode (static KV cache
   + CUDA graphs);
2. ``b(n)`` for n = 1..8 branches sharing a 4096-token context (engine, GPU mode, Qwen3-32B shape);
3. ``ar`` vs ``lr+sd`` with the demo trio on the GPU (greedy, synthetic problems).
Each section catches its own failure and reports it in the table, so one failure does not hide the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHAPES = {
    "Qwen3-1.7B": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144),
    "Qwen3-32B": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                      head_dim=128, intermediate_size=25600),
}


def random_model(shape: str, context: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=context + 1024, tie_word_embeddings=False,
                      **SHAPES[shape])
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen3ForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    return model.eval()


def time_generate(model, batch: int, context: int, new: int, **kw) -> float:
    ids = torch.randint(0, 1000, (batch, context), device="cuda")
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, **kw)  # warm-up / compile
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kw)
    torch.cuda.synchronize()
    t_long = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, **kw)
    torch.cuda.synchronize()
    t_short = time.perf_counter() - t0
    return 1e3 * (t_long - t_short) / (new - 8)  # per decoding step, prefill cancelled out


def engine_for(model, tokenizer_dir: str, batch_sizes, context: int):
    from lookahead_reasoning.backends.portable import PortableEngine, PortableEngineConfig

    cfg = PortableEngineConfig(model=tokenizer_dir, dtype="bfloat16", device="cuda", static_cache=True,
                               static_cache_tokens=context + 256, cuda_graphs=True,
                               graph_batch_sizes=tuple(batch_sizes), max_batch_size=max(batch_sizes),
                               prefix_cache_mb=8192)
    return PortableEngine(cfg, model=model)


def engine_step_ms(engine, prompts, new: int) -> float:
    from lookahead_reasoning.backends.base import GenerationRequest

    engine.generate([GenerationRequest(p, 8) for p in prompts])  # capture graphs, warm prefix cache
    engine.record_steps = True
    engine.step_seconds.clear()
    engine.generate([GenerationRequest(p, new) for p in prompts])
    engine.record_steps = False
    steps = [s for b, w, s in engine.step_seconds if b == len(prompts) and w == 1][4:]
    return 1e3 * statistics.median(steps)


def section(results: dict, name: str, fn) -> None:
    t0 = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - report and continue with the next measurement
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
    results[name + "_seconds"] = time.perf_counter() - t0
    print(f"[{time.perf_counter() - T0:6.1f} s] {name}: {json.dumps(results[name])[:400]}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="gpu_bench.md")
    ap.add_argument("--json", default="gpu_bench.json")
    ap.add_argument("--new", type=int, default=64, help="decoding steps timed per measurement")
    ap.add_argument("--problems", type=int, default=10)
    args = ap.parse_args(argv)
    tok_dir = str(REPO / "engines" / "demo" / "target")
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import transformers

    res["transformers"] = transformers.__version__
    for shape in ("Qwen3-1.7B", "Qwen3-32B"):
        model = random_model(shape, 4096)
        for batch in (1, 4):
            section(res, f"{shape} b{batch} transformers eager", lambda: time_generate(model, batch, 512, args.new))
            section(res, f"{shape} b{batch} transformers static", lambda: time_generate(
                model, batch, 512, args.new, cache_implementation="static"))
        engine = engine_for(model, tok_dir, (1, 2, 3, 4, 5, 6, 7, 8), 4096)
        for batch in (1, 4):
            prompts = [[(7 * i + j) % 1000 for j in range(512)] for i in range(batch)]
            section(res, f"{shape} b{batch} engine graphs", lambda: engine_step_ms(engine, prompts, args.new))
        if shape == "Qwen3-32B":
            base = [(13 * j) % 1000 for j in range(4096)]

            def b_of_n():
                ms = {n: engine_step_ms(engine, [base + [n, i] for i in range(n)], 24) for n in range(1, 9)}
                return {str(n): ms[n] / ms[1] for n in ms} | {"ms_n1": ms[1]}

            section(res, "b(n) Qwen3-32B ctx4096", b_of_n)
        engine.close()
        model = engine = None  # free the weights before the next shape
        torch.cuda.empty_cache()
    section(res, "demo trio ar vs lr+sd", lambda: demo_trio(args.problems))
    Path(args.json).write_text(json.dumps(res, indent=2))
    Path(args.out).write_text(markdown(res))
    print(markdown(res))
    return 0


def demo_trio(n: int) -> dict:
    from lookahead_reasoning.evaluation.answers import check_answer, load_items
    from lookahead_reasoning.backends.portable import PortableEngine
    from lookahead_reasoning.core.lookahead import LookaheadReasoner, LROptions

    def eng(role):
        return PortableEngine.from_pretrained(str(REPO / "engines" / "demo" / role), dtype="bfloat16", device="cuda",
                                              static_cache=True, cuda_graphs=True, max_batch_size=8,
                                              graph_batch_sizes=(1, 2, 3, 4, 5, 6, 7, 8), graph_widths=(1, 7))
    draft, judge = eng("draft"), eng("judge")
    target = eng("target")
    r = LookaheadReasoner(target, draft, judge)
    items = load_items("synthetic", n)
    out = {}
    for mode in ("ar", "lr+sd", "ar", "lr+sd"):  # second pass measured (first warms graphs)
        tokens, seconds, correct = 0, 0.0, 0
        for it in items:
            res = r.run(it.prompt, options=LROptions(mode=mode))
            tokens += res.metrics.generated_tokens
            seconds += res.metrics.seconds
            correct += bool(check_answer(it, res.text))
        out[mode] = {"tokens_per_s": tokens / seconds, "correct": correct, "n": len(items)}
    out["speedup"] = out["lr+sd"]["tokens_per_s"] / out["ar"]["tokens_per_s"]
    for e in (target, draft, judge):
        e.close()
    return out


def markdown(res: dict) -> str:
    lines = [f"GPU: {res['gpu']}; torch {res['torch']}; transformers {res['transformers']}", "",
             "| measurement | value |", "|---|---|"]
    for k, v in res.items():
        if k in ("gpu", "torch", "transformers") or k.endswith("_seconds"):
            continue
        if isinstance(v, dict) and "error" in v:
            val = "FAILED: " + v["error"][:200]
        elif isinstance(v, float):
            val = f"{v:.2f} ms/step"
        else:
            val = json.dumps(v)
        lines.append(f"| {k} | {val} |")
    return "\n".join(lines) + "\n"


T0 = time.perf_counter()

if __name__ == "__main__":
    sys.exit(main())
