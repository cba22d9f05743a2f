#!/usr/bin/env python
"""FP8 post-training quantization of a Hugging Face causal LM into a Hugging Face-format FP8 checkpoint,
plus an accuracy check of the result through the portable engine.

Backends (``--backend``):

- ``modelopt`` (default when ``nvidia-modelopt`` imports): NVIDIA ModelOpt ``mtq.quantize`` with
  ``FP8_DEFAULT_CFG`` (per-tensor E4M3 weights and static per-tensor input activations, max calibration;
  lm_head and embeddings stay unquantized) and, for an FP8 KV cache, ``FP8_KV_CFG`` (per-tensor K/V scales
  after RoPE); exported with ``modelopt.torch.export.export_hf_checkpoint``: ``model.safetensors`` with
  ``*.weight`` in ``float8_e4m3fn`` and fp32 ``*.weight_scale`` / ``*.input_scale`` (/ ``k_proj.k_scale``,
  ``v_proj.v_scale``), ``hf_quant_config.json`` and ``quantization_config`` (``quant_method: modelopt``) in
  ``config.json``: the format TensorRT-LLM's LLM API loads as a pre-quantized checkpoint. ModelOpt 0.47
  runs this on CPU (fake-quant calibration), so small models quantize here; a 32B model needs GPUs.
- ``torch`` (fallback; used automatically when ModelOpt is missing or refuses, with its error printed):
  the same per-tensor scheme written by hand. For every ``nn.Linear`` of the decoder (not ``lm_head``):
  ``weight_scale = max|W| / 448`` (448 = largest finite E4M3 value), ``W_fp8 = cast_e4m3(clamp(W /
  weight_scale, -448, 448))`` (round to nearest even by torch's cast), ``input_scale = max over calibration
  of max|x| / 448`` for the layer's input ``x``; same file layout and config keys as ModelOpt's export
  (producer named differently). It does not calibrate KV-cache scales (``--kv-cache fp8`` needs ModelOpt).

Dequantization for the accuracy check (``--eval-problems N``): ``W = float(W_fp8) * weight_scale`` written as
an ordinary checkpoint (``<out>/../<name>-dequantized``), loaded by the portable engine; ``W8`` evaluates it
as is (weight error only), ``W8A8`` also fake-quantizes every quantized layer's input with its static
``input_scale`` (``x -> cast_e4m3(clamp(x / s)) * s``, what FP8 GEMMs see). The FP8 KV cache is not simulated.
Accuracy is the project's evaluation (``lookahead_reasoning.evaluation.runner.run_eval``, mode ``ar``, greedy) on
held-out synthetic problems (``load_items("synthetic", N)``: seed ``EVAL_SEED``), also reporting how many
answers are token-identical to the unquantized model's.

Usage::

    python build_scripts/quantize_fp8.py --model engines/demo/target --out engines/built/demo-target-fp8/checkpoint \\
        --weights fp8 --kv-cache fp8 --dtype float16 --eval-problems 100
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_EXCLUDE = ("lm_head", "model.embed_tokens")


# -- calibration data ----------------------------------------------------------------------------------------

def calibration_ids(tokenizer, dataset: str, samples: int, max_seq_len: int, seed: int) -> list[list[int]]:
    """Token ids of ``samples`` calibration sequences: chat-templated question + worked answer + EOS.

    ``dataset``: ``synthetic`` (generator problems from ``seed``; refused for the held-out seeds) or a JSONL
    file with ``question`` / ``answer`` rows. Each sequence is cut to ``max_seq_len`` tokens.
    """
    from lookahead_reasoning.evaluation.synthetic import generate_problems, is_reserved_seed

    if dataset == "synthetic":
        if is_reserved_seed(seed):
            raise ValueError(f"--calib-seed: {seed} is a held-out evaluation seed")
        pairs = [(p.question, p.solution) for p in generate_problems(samples, seed)]
    else:
        pairs = []
        with open(dataset) as f:
            for line in f:
                if line.strip() and len(pairs) < samples:
                    row = json.loads(line)
                    pairs.append((row["question"], row["answer"]))
        if not pairs:
            raise ValueError(f"--calib-dataset: {dataset} holds no question/answer rows")
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = []
    for q, a in pairs:
        if getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                                   add_generation_prompt=True, return_dict=False)
            prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
        else:
            prompt = tokenizer.encode(q + "\n\n", add_special_tokens=False)
        ids = prompt + tokenizer.encode(a, add_special_tokens=False) + eos
        out.append(ids[:max_seq_len])
    return out


def _forward_loop(ids: list[list[int]], device: torch.device):
    def loop(model):
        with torch.no_grad():
            for seq in ids:
                model(torch.tensor([seq], device=device))
    return loop


# -- ModelOpt --------------------------------------------------------------------------------------------------

def _combine_cfg(base: dict, extra: dict) -> dict:
    """Append ``extra``'s quantizer rules to ``base`` (``quant_cfg`` is a list in ModelOpt >= 0.4x, a dict before)."""
    cfg = copy.deepcopy(base)
    q, e = cfg["quant_cfg"], extra["quant_cfg"]
    cfg["quant_cfg"] = (list(q) + list(e)) if isinstance(q, list) else {**q, **e}
    return cfg


def quantize_modelopt(model, ids, device, weights_fp8: bool, kv_fp8: bool):
    """Calibrate ``model`` in place with ModelOpt and return it (fake-quantized, ready for export)."""
    import modelopt.torch.quantization as mtq

    if weights_fp8:
        cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    else:  # KV-cache scales only: every other quantizer off
        off = [{"quantizer_name": "*", "enable": False}] if isinstance(mtq.FP8_DEFAULT_CFG["quant_cfg"], list) \
            else {"*": {"enable": False}}
        cfg = {"quant_cfg": off, "algorithm": "max"}
    if kv_fp8:
        cfg = _combine_cfg(cfg, mtq.FP8_KV_CFG)
    return mtq.quantize(model, cfg, _forward_loop(ids, device))


def export_modelopt(model, out: Path, dtype: torch.dtype) -> None:
    from modelopt.torch.export import export_hf_checkpoint

    with torch.no_grad():
        export_hf_checkpoint(model, dtype=dtype, export_dir=str(out))


# -- hand-written per-tensor FP8 (fallback) ---------------------------------------------------------------

def _quantizable(name: str, module) -> bool:
    return isinstance(module, torch.nn.Linear) and not any(name == e or name.startswith(e + ".") for e in _EXCLUDE)


def fp8_per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w_fp8, scale)``: E4M3 weights and the fp32 scalar ``scale = max|w| / 448`` (1.0 for an all-zero w)."""
    amax = w.detach().abs().max().float()
    scale = (amax / E4M3_MAX) if amax > 0 else torch.tensor(1.0)
    q = (w.detach().float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale.reshape(())


def fake_quant(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``cast_e4m3(clamp(x / scale, -448, 448)) * scale`` in ``x``'s dtype (what an FP8 GEMM input sees)."""
    return ((x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def quantize_torch(model, ids, device, out: Path, dtype: torch.dtype, kv_fp8: bool) -> None:
    """The fallback scheme (module docstring): calibrate input amax with hooks, write the FP8 checkpoint."""
    from safetensors.torch import save_file

    if kv_fp8:
        raise RuntimeError("--kv-cache fp8 needs ModelOpt (the torch fallback does not calibrate KV-cache scales)")
    amax: dict[str, float] = {}
    hooks = []
    for name, mod in model.named_modules():
        if _quantizable(name, mod):
            def hook(_m, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].detach().abs().max()))
            hooks.append(mod.register_forward_pre_hook(hook))
    _forward_loop(ids, device)(model)
    for h in hooks:
        h.remove()
    state = {}
    for name, mod in model.named_modules():
        if _quantizable(name, mod):
            q, s = fp8_per_tensor(mod.weight)
            state[f"{name}.weight"] = q.cpu()
            state[f"{name}.weight_scale"] = s.cpu()
            state[f"{name}.input_scale"] = torch.tensor(max(amax.get(name, 0.0), 1e-12) / E4M3_MAX)
            if mod.bias is not None:
                state[f"{name}.bias"] = mod.bias.detach().to(dtype).cpu()
    quantized = {k.rsplit(".", 1)[0] for k in state}
    for key, t in model.state_dict().items():
        if key.rsplit(".", 1)[0] not in quantized:
            state[key] = t.detach().to(dtype).cpu().contiguous()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    producer = {"name": "lookahead_reasoning.quantize_fp8 (per-tensor torch)", "version": "1"}
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": producer, "quantization": {
        "quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": list(_EXCLUDE)}}, indent=4))
    cfg = model.config.to_dict()
    cfg["dtype"] = str(dtype).replace("torch.", "")
    cfg["quantization_config"] = {
        "config_groups": {"group_0": {"input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                                      "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
                                      "targets": ["Linear"]}},
        "ignore": list(_EXCLUDE), "quant_algo": "FP8", "producer": producer, "quant_method": "modelopt"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)


# -- dequantization and evaluation -----------------------------------------------------------------------

def read_fp8_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, float], dict]:
    """``(state, input_scales, config)`` of an FP8 checkpoint: ``state`` with fp32 dequantized weights
    (``W = W_fp8 * weight_scale``) and without scale tensors; ``input_scales[module]`` = static input scale."""
    from safetensors import safe_open

    raw: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                raw[k] = sf.get_tensor(k)
    state, scales = {}, {}
    for k, t in raw.items():
        mod, _, leaf = k.rpartition(".")
        if leaf in ("weight_scale", "input_scale", "k_scale", "v_scale", "weight_scale_2", "pre_quant_scale"):
            if leaf == "input_scale":
                scales[mod] = float(t.float().reshape(-1)[0])
            continue
        if t.dtype == torch.float8_e4m3fn:
            s = raw.get(f"{mod}.weight_scale")
            if s is None:
                raise ValueError(f"{k}: FP8 tensor without {mod}.weight_scale")
            t = t.float() * s.float()
        state[k] = t.float()
    config = json.loads((path / "config.json").read_text())
    return state, scales, config


def dequantize_checkpoint(src: Path, dst: Path, tokenizer_dir: Path | None = None) -> dict[str, float]:
    """Write ``src``'s FP8 checkpoint dequantized to fp32 as an ordinary checkpoint in ``dst``; returns the
    static input scales per module (for :func:`install_input_fake_quant`)."""
    from safetensors.torch import save_file

    state, scales, cfg = read_fp8_checkpoint(src)
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    cfg.pop("torch_dtype", None)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in ("generation_config.json",):
        if (src / name).exists():
            shutil.copyfile(src / name, dst / name)
    _copy_tokenizer(tokenizer_dir or src, dst)
    return scales


def install_input_fake_quant(model, scales: dict[str, float]) -> int:
    """Fake-quantize each listed module's input with its static FP8 scale (forward pre-hooks); returns the count."""
    n = 0
    for name, mod in model.named_modules():
        if name in scales:
            s = scales[name]
            mod.register_forward_pre_hook(lambda _m, args, s=s: (fake_quant(args[0], s),) + tuple(args[1:]))
            n += 1
    return n


def _copy_tokenizer(src: Path, dst: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(dst))


def weight_error(original: Path, deq_state: dict[str, torch.Tensor]) -> dict[str, float]:
    """Relative Frobenius error ``|W - W_deq| / |W|`` over the quantized weights: mean and max."""
    from safetensors import safe_open

    errs = []
    for f in sorted(original.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                if k in deq_state and k.endswith(".weight") and not any(k.startswith(e) for e in _EXCLUDE):
                    w = sf.get_tensor(k).float()
                    if w.ndim == 2:
                        errs.append(float((w - deq_state[k]).norm() / max(float(w.norm()), 1e-12)))
    return {"layers": len(errs), "mean_rel_error": sum(errs) / max(len(errs), 1), "max_rel_error": max(errs or [0.0])}


def evaluate(model_dir: Path, n: int, threads: int, input_scales: dict[str, float] | None = None,
             baseline: list[str] | None = None) -> dict:
    """Accuracy (greedy, mode ``ar``) of the checkpoint in ``model_dir`` on ``n`` held-out synthetic problems."""
    from lookahead_reasoning.backends.portable import PortableEngine
    from lookahead_reasoning.core.lookahead import LookaheadReasoner
    from lookahead_reasoning.evaluation.answers import load_items
    from lookahead_reasoning.evaluation.runner import run_eval
    from lookahead_reasoning.profiles import PROFILES

    engine = PortableEngine.from_pretrained(str(model_dir), num_threads=threads)
    try:
        hooked = install_input_fake_quant(engine.model, input_scales) if input_scales else 0
        reasoner = LookaheadReasoner(engine, defaults=PROFILES["demo"].options)
        items = load_items("synthetic", n)
        t0 = time.perf_counter()
        rep = run_eval(reasoner, items, ["ar"], PROFILES["demo"].options, keep_outputs=True)["ar"]
        texts = [o["text"] for o in rep.outputs]
    finally:
        engine.close()
    doc = {"problems": rep.n, "correct": rep.correct, "accuracy": rep.accuracy, "accuracy_stderr": rep.accuracy_stderr,
           "generated_tokens": rep.tokens, "seconds": round(time.perf_counter() - t0, 1), "fake_quant_inputs": hooked}
    if baseline is not None:
        doc["identical_to_unquantized"] = sum(a == b for a, b in zip(texts, baseline, strict=False))
    return doc, texts


# -- main ------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="source Hugging Face checkpoint (folder or hub id)")
    ap.add_argument("--out", required=True, type=Path, help="output folder of the FP8 checkpoint")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES), help="dtype of unquantized tensors")
    ap.add_argument("--weights", default="fp8", choices=["fp8", "unquantized"])
    ap.add_argument("--kv-cache", default="auto", choices=["fp8", "auto"])
    ap.add_argument("--calib-dataset", default="synthetic")
    ap.add_argument("--calib-samples", type=int, default=512)
    ap.add_argument("--calib-max-seq-len", type=int, default=512)
    ap.add_argument("--calib-seed", type=int, default=1_000_003)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--backend", default="auto", choices=["auto", "modelopt", "torch"])
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--eval-problems", type=int, default=0, help="compare accuracy on N held-out problems")
    ap.add_argument("--eval-threads", type=int, default=1)
    ap.add_argument("--report", type=Path, default=None, help="JSON report (default <out>/fp8_report.json)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.weights == "unquantized" and args.kv_cache == "auto":
        ap.error("--weights unquantized with --kv-cache auto: nothing to quantize")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    # Calibrate in fp32 on CPU (bf16 matmuls there are slow and coarse); in the export dtype on GPU.
    calib_dtype = torch.float32 if device.type == "cpu" else _DTYPES[args.dtype]
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=calib_dtype,
                                                 trust_remote_code=args.trust_remote_code,
                                                 device_map="auto" if device.type == "cuda" else None)
    if device.type == "cpu":
        model = model.to(device)
    model.eval()
    ids = calibration_ids(tok, args.calib_dataset, args.calib_samples, args.calib_max_seq_len, args.calib_seed)
    report: dict = {"source": str(args.model), "out": str(args.out), "device": str(device), "dtype": args.dtype,
                    "weights": args.weights, "kv_cache": args.kv_cache, "calibration": {
                        "dataset": args.calib_dataset, "samples": len(ids), "tokens": sum(map(len, ids)),
                        "seed": args.calib_seed}}
    backend = args.backend
    if backend in ("auto", "modelopt"):
        try:
            import modelopt

            model = quantize_modelopt(model, ids, device, args.weights == "fp8", args.kv_cache == "fp8")
            export_modelopt(model, args.out, _DTYPES[args.dtype])
            report["backend"] = f"modelopt {modelopt.__version__}"
        except Exception as exc:  # noqa: BLE001 - report ModelOpt's own error, then fall back
            if backend == "modelopt":
                raise
            print(f"ModelOpt failed ({type(exc).__name__}: {exc}); using the per-tensor torch scheme", file=sys.stderr)
            report["modelopt_error"] = f"{type(exc).__name__}: {exc}"
            backend = "torch"
            model = AutoModelForCausalLM.from_pretrained(args.model, dtype=calib_dtype).to(device).eval()
    if backend == "torch":
        quantize_torch(model, ids, device, args.out, _DTYPES[args.dtype], args.kv_cache == "fp8")
        report["backend"] = "torch per-tensor E4M3"
    tok.save_pretrained(str(args.out))
    report["quantize_seconds"] = round(time.perf_counter() - t0, 1)
    report["files"] = sorted(p.name for p in args.out.iterdir())
    del model

    if args.eval_problems > 0:
        src = Path(args.model)
        if not src.is_dir():
            ap.error("--eval-problems needs a local --model folder")
        deq = args.out.parent / f"{args.out.name}-dequantized"
        scales = dequantize_checkpoint(args.out, deq, tokenizer_dir=src)
        state, _, _ = read_fp8_checkpoint(args.out)
        report["weight_error"] = weight_error(src, state)
        base, base_texts = evaluate(src, args.eval_problems, args.eval_threads)
        w8, _ = evaluate(deq, args.eval_problems, args.eval_threads, baseline=base_texts)
        w8a8, _ = evaluate(deq, args.eval_problems, args.eval_threads, input_scales=scales, baseline=base_texts)
        report["eval"] = {"dataset": "synthetic held-out (EVAL_SEED), greedy, mode ar", "unquantized": base,
                          "fp8_weights_dequantized": w8, "fp8_weights_and_static_inputs": w8a8,
                          "note": "FP8 KV cache not simulated; dequantized copy in " + str(deq)}
    out = args.report or (args.out / "fp8_report.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
