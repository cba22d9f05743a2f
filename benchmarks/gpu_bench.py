"""GPU benchmark of the portable engine's GPU mode on random-weight Qwen3 shapes (run by benchmarks/gpu_bench.sh).

Measures and writes a markdown table (``--out``) and JSON (``--json``, rewritten after every section, so a run
stopped by its time limit keeps what it measured):
1. ms per decoding step, random-weight Qwen3-32B and Qwen3-1.7B shapes (bf16), batch 1 and 4, context 512:
   this engine in GPU mode (static KV cache + CUDA graphs) with its default attention (``grouped_sdpa``,
   backends/attention.py) and with transformers' ``sdpa`` (keys and values copied per query head), plain
   transformers ``generate`` (eager, DynamicCache) and, for the 1.7B shape only, transformers' static cache
   (``cache_implementation="static"``, compiled by the library: on the 32B shape the compile outlasted a
   160-second budget on an H200, 2026-12-04);
2. ``b(n)`` for n = 1..8 branches sharing a 4096-token context (engine, GPU mode, Qwen3-32B shape): the cost of
   one target forward over n branches relative to one, the ``b(n)`` of the speed model (docs/design.md).
The demo trio's ``ar`` vs ``lr+sd`` on the GPU is measured by ``benchmarks/lr_bench.py --config
engines/profiles/demo-gpu.yaml`` (gpu_bench.sh runs both).
Each section catches its own failure and reports it in the table, so one failure does not hide the rest; a
section that would start after ``--budget-s`` seconds is skipped and reported as such.
``--device cpu --smoke`` runs the same code on a tiny shape on the CPU (static cache, no graphs): a check of
this script, not a measurement.
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
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128),
}
DEVICE = "cuda"


def random_model(shape: str, context: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=context + 1024, tie_word_embeddings=False,
                      **SHAPES[shape])
    with torch.device(DEVICE):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen3ForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    return model.eval()


def sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def time_generate(model, batch: int, context: int, new: int, **kw) -> float:
    ids = torch.randint(0, 1000, (batch, context), device=DEVICE)
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, **kw)  # warm-up / compile
    sync()
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kw)
    sync()
    t_long = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, **kw)
    sync()
    t_short = time.perf_counter() - t0
    return 1e3 * (t_long - t_short) / (new - 8)  # per decoding step, prefill cancelled out


def engine_for(model, tokenizer_dir: str, batch_sizes, context: int, attn: str = "auto"):
    from lookahead_reasoning.backends.portable import PortableEngine, PortableEngineConfig

    cfg = PortableEngineConfig(model=tokenizer_dir, dtype="bfloat16", device=DEVICE, static_cache=True,
                               static_cache_tokens=context + 256, cuda_graphs=DEVICE.startswith("cuda"),
                               graph_batch_sizes=tuple(batch_sizes), max_batch_size=max(batch_sizes),
                               prefix_cache_mb=8192, attn_implementation=attn)
    return PortableEngine(cfg, model=model)  # sets the model's attention in place


def engine_step_ms(engine, prompts, new: int) -> float:
    from lookahead_reasoning.backends.base import GenerationRequest

    engine.generate([GenerationRequest(p, 8) for p in prompts])  # capture graphs, warm prefix cache
    engine.record_steps = True
    engine.step_seconds.clear()
    engine.generate([GenerationRequest(p, new) for p in prompts])
    engine.record_steps = False
    steps = [s for b, w, s in engine.step_seconds if b == len(prompts) and w == 1][4:]
    return 1e3 * statistics.median(steps)


def section(results: dict, name: str, fn, budget_s: float, json_path: str, md_path: str) -> None:
    if time.perf_counter() - T0 > budget_s:
        results[name] = {"error": f"skipped: the {budget_s:.0f} s budget was spent"}
    else:
        t0 = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - report and continue with the next measurement
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        results[name + "_seconds"] = time.perf_counter() - t0
    Path(json_path).write_text(json.dumps(results, indent=2))
    Path(md_path).write_text(markdown(results))  # a run stopped by its time limit keeps both
    print(f"[{time.perf_counter() - T0:6.1f} s] {name}: {json.dumps(results[name])[:400]}", flush=True)


def main(argv=None) -> int:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_bench.md")
    ap.add_argument("--json", default="gpu_bench.json")
    ap.add_argument("--new", type=int, default=64, help="decoding steps timed per measurement")
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no section after this many seconds")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shape, short runs: checks this script (use on CPU)")
    args = ap.parse_args(argv)
    DEVICE = args.device
    shapes = ("tiny",) if args.smoke else ("Qwen3-32B", "Qwen3-1.7B")  # 32B first: b(n) feeds the speed model
    context, new = (64, 40) if args.smoke else (512, args.new)
    tok_dir = str(REPO / "engines" / "demo" / "target")
    import transformers

    res: dict = {"date": time.strftime("%Y-%m-%d"),
                 "command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
                 "gpu": torch.cuda.get_device_name(0) if DEVICE.startswith("cuda") else DEVICE,
                 "torch": torch.__version__, "transformers": transformers.__version__}

    # section() calls fn at once; the lambdas and b_of_n below bind the loop's current values as default arguments
    def run(name, fn):
        section(res, name, fn, args.budget_s, args.json, args.out)

    for shape in shapes:
        if time.perf_counter() - T0 > args.budget_s:
            break
        long_ctx = 256 if args.smoke else 4096
        model = random_model(shape, long_ctx)
        mode = "graphs" if DEVICE.startswith("cuda") else "static cache"
        for attn in ("auto", "sdpa"):  # auto = grouped_sdpa in GPU mode
            label = "" if attn == "auto" else " (sdpa attention)"
            engine = engine_for(model, tok_dir, (1, 2, 3, 4, 5, 6, 7, 8), long_ctx, attn)
            for batch in (1, 4):
                prompts = [[(7 * i + j) % 1000 for j in range(context)] for i in range(batch)]
                run(f"{shape} b{batch} engine {mode}{label}",
                    lambda engine=engine, prompts=prompts: engine_step_ms(engine, prompts, new))
            if shape in ("Qwen3-32B", "tiny"):
                base = [(13 * j) % 1000 for j in range(long_ctx)]

                def b_of_n(engine=engine, base=base):
                    ms = {n: engine_step_ms(engine, [base + [n, i] for i in range(n)], 24) for n in range(1, 9)}
                    return {str(n): ms[n] / ms[1] for n in ms} | {"ms_n1": ms[1]}

                run(f"b(n) {shape} ctx{long_ctx}{label}", b_of_n)
            engine.close()
            engine = None
        model.set_attn_implementation("sdpa")  # transformers' own rows run its default attention
        for batch in (1, 4):
            run(f"{shape} b{batch} transformers eager",
                lambda model=model, batch=batch: time_generate(model, batch, context, new))
        if shape != "Qwen3-32B":
            for batch in (1, 4):  # last: the library compiles the model per batch size
                run(f"{shape} b{batch} transformers static", lambda model=model, batch=batch: time_generate(
                    model, batch, context, new, cache_implementation="static"))
        model = None  # free the weights before the next shape
        if DEVICE.startswith("cuda"):
            torch.cuda.empty_cache()
    print(markdown(res))  # section() has written --json and --out after every section
    return 0


def markdown(res: dict) -> str:
    lines = [f"{res['date']}; GPU: {res['gpu']}; torch {res['torch']}; transformers {res['transformers']}",
             f"Command: `{res['command']}`", "",
             "| measurement | value |", "|---|---|"]
    for k, v in res.items():
        if k in ("gpu", "torch", "transformers", "date", "command") or k.endswith("_seconds"):
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
