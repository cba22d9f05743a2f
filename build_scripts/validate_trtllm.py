#!/usr/bin/env python
"""GPU validation of the TensorRT-LLM path (docs/production.md, "GPU validation procedure").

NOT RUN IN CI: needs an NVIDIA GPU (compute capability >= 8.9 for FP8 specs) and TensorRT-LLM (run it inside
the image of docker/Dockerfile). Each check prints PASS/FAIL and the JSON report lists the measurements; the
exit status is 1 if any check failed.

Checks, on one engine spec and a local checkpoint folder:

1. ``import``: tensorrt_llm version, GPU name and compute capability.
2. ``greedy_vs_portable``: greedy outputs of :class:`TrtllmEngine` against the portable engine (transformers,
   bf16 on the same GPU) for held-out synthetic prompts: different kernels round differently, so the check
   is agreement of the first 8 tokens on >= 75% of prompts, and the mean common-prefix length is reported.
3. ``stop_strings``: ``"\\n\\n"`` stops end with the token that completes the stop (also when it is merged
   into a larger token), finish reason ``stop``.
4. ``seeds``: the same seed reproduces a sampled output; another seed changes it.
5. ``prefix_reuse``: 5 branches sharing a long prefix: the second identical batch is faster than the first
   (KV block reuse), reported as a ratio.
6. ``lossless_lr`` (with ``--draft-spec``/``--draft-model``): the LR loop with the exact-match verifier and
   greedy sampling reproduces the target's own autoregressive text.
7. ``openai_vs_inprocess`` (with ``--serve-url``, a trtllm-serve of the same spec): the OpenAI-compatible
   backend returns the same greedy ids as the in-process engine.

Usage (inside the container, after ``lookahead-reasoning build --spec engines/qwen3-1.7b-draft.yaml``)::

    python build_scripts/validate_trtllm.py --spec engines/qwen3-1.7b-draft.yaml --model /models/Qwen3-1.7B \\
        --out /tmp/validate.json [--serve-url http://127.0.0.1:8002]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _prompts(engine, n: int) -> list[list[int]]:
    from lookahead_reasoning.evaluation.synthetic import EVAL_SEED, generate_problems

    out = []
    for p in generate_problems(n, EVAL_SEED):
        msgs = [{"role": "user", "content": p.question}]
        out.append(engine.apply_chat_template(msgs) if getattr(engine.tokenizer, "chat_template", None)
                   else engine.encode(p.question + "\n\n"))
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="engine spec (runtime llmapi)")
    ap.add_argument("--model", required=True, help="local checkpoint folder the spec serves")
    ap.add_argument("--draft-spec", default=None)
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--serve-url", default=None, help="trtllm-serve of the same spec (OpenAI-compatible)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("validate_trtllm.json"))
    args = ap.parse_args(argv)

    import torch
    from lookahead_reasoning.backends.base import GenerationRequest, SamplingParams
    from lookahead_reasoning.backends.trtllm import TrtllmEngine, import_tensorrt_llm
    from lookahead_reasoning.production.engine_specs import load_spec

    report: dict = {"spec": args.spec, "model": args.model, "checks": {}}
    failed: list[str] = []

    def check(name: str, ok: bool, **data) -> None:
        report["checks"][name] = {"pass": bool(ok), **data}
        print(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(data)}", flush=True)
        if not ok:
            failed.append(name)

    trt, _ = import_tensorrt_llm()
    cap = torch.cuda.get_device_capability(0)
    check("import", True, tensorrt_llm=trt.__version__, gpu=torch.cuda.get_device_name(0), capability=list(cap))

    spec = load_spec(args.spec)
    engine = TrtllmEngine(spec, model=args.model)
    prompts = _prompts(engine, args.prompts)

    # 2. greedy agreement with the portable engine (bf16, same GPU)
    from lookahead_reasoning.backends.portable import PortableEngine

    t0 = time.perf_counter()
    trt_out = engine.generate([GenerationRequest(p, args.tokens) for p in prompts])
    trt_s = time.perf_counter() - t0
    portable = PortableEngine.from_pretrained(args.model, dtype="bfloat16", device="cuda")
    t0 = time.perf_counter()
    ref_out = portable.generate([GenerationRequest(p, args.tokens) for p in prompts])
    ref_s = time.perf_counter() - t0
    portable.close()
    prefixes = [_common_prefix(a.token_ids, b.token_ids) for a, b in zip(trt_out, ref_out, strict=False)]
    agree8 = sum(p >= min(8, len(b.token_ids)) for p, b in zip(prefixes, ref_out, strict=False))
    check("greedy_vs_portable", agree8 >= 0.75 * len(prompts), prompts=len(prompts), first8_agree=agree8,
          identical=sum(a.token_ids == b.token_ids for a, b in zip(trt_out, ref_out, strict=False)),
          mean_common_prefix=sum(prefixes) / len(prefixes), trtllm_s=round(trt_s, 2), portable_s=round(ref_s, 2))

    # 3. stop strings on decoded text
    res = engine.generate([GenerationRequest(p, 200, stop=("\n\n",)) for p in prompts[:8]])
    ok = all(r.finish_reason in ("stop", "eos") for r in res) and all(
        "\n\n" in r.text and "\n\n" not in engine.decode(r.token_ids[:-1]) for r in res if r.finish_reason == "stop")
    check("stop_strings", ok, finish=[r.finish_reason for r in res])

    # 4. seeds
    def sample(seed):
        sp = SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=seed)
        return [r.token_ids for r in engine.generate([GenerationRequest(p, 32, sampling=sp) for p in prompts[:4]])]

    a, b, c = sample(1), sample(1), sample(2)
    check("seeds", a == b and a != c, same_seed_equal=a == b, other_seed_differs=a != c)

    # 5. prefix reuse
    prefix = prompts[0] + engine.encode(" step" * 1500)[
        : max(0, min(2000, spec.limits.max_input_len - 64) - len(prompts[0]))]
    branches = [GenerationRequest(prefix + engine.encode(f" {k}"), 8) for k in range(5)]
    t0 = time.perf_counter()
    engine.generate(branches)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.generate(branches)
    second = time.perf_counter() - t0
    check("prefix_reuse", second < first, first_s=round(first, 3), second_s=round(second, 3),
          ratio=round(second / first, 3), prefix_tokens=len(prefix))

    # 6. lossless LR with the exact verifier
    if args.draft_spec and args.draft_model:
        from lookahead_reasoning.core.lookahead import LookaheadReasoner, LROptions
        from lookahead_reasoning.core.verifiers import VerifierConfig

        draft = TrtllmEngine(load_spec(args.draft_spec), model=args.draft_model)
        lr = LookaheadReasoner(engine, draft)
        opts = LROptions(mode="lr", gamma=3, max_tokens=256, judge=VerifierConfig(name="exact"))
        same = 0
        for p in prompts[:4]:
            text = engine.decode(p)
            ar = lr.run(text, None, opts.model_copy(update={"mode": "ar"}))
            spec_run = lr.run(text, None, opts)
            same += ar.text == spec_run.text
        draft.close()
        check("lossless_lr", same == 4, identical=same, of=4)

    # 7. OpenAI-compatible backend against trtllm-serve
    if args.serve_url:
        from lookahead_reasoning.backends.openai_http import OpenAIEngine, OpenAIEngineConfig

        client = OpenAIEngine(OpenAIEngineConfig(url=args.serve_url, tokenizer=args.model, flavor="trtllm-serve"))
        remote = client.generate([GenerationRequest(p, args.tokens) for p in prompts])
        client.close()
        same = sum(x.token_ids == y.token_ids for x, y in zip(remote, trt_out, strict=False))
        check("openai_vs_inprocess", same == len(prompts), identical=same, of=len(prompts))

    engine.close()
    report["failed"] = failed
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {args.out}; {'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
