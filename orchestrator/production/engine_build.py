"""``lookahead-reasoning build``: turn an engine spec (``engines/*.yaml``) into served artifacts.

:func:`plan_build` computes every step as data (commands to run, files to write); ``--dry-run`` prints the
plan, a real build executes it in order. Nothing else decides what a build does, so the dry run shows exactly
what a build would do.

Runtime ``llmapi`` (TensorRT-LLM LLM API, PyTorch runtime; the supported path):

1. FP8 weights and/or FP8 KV-cache scales (``precision``): ``build_scripts/quantize_fp8.py`` calibrates the
   Hugging Face checkpoint with NVIDIA ModelOpt and exports a Hugging Face-format FP8 checkpoint to
   ``<out>/checkpoint`` (runs on a GPU host, or on CPU for small models; see that script).
2. ``<out>/llm_api_options.yaml``: the options of ``tensorrt_llm.LLM`` = the file ``trtllm-serve MODEL
   --config FILE`` reads (:func:`~lookahead_reasoning.production.engine_specs.llm_api_options`).
3. ``<out>/serve.sh``: one ``trtllm-serve`` per replica, pinned with ``CUDA_VISIBLE_DEVICES``.
4. ``<out>/engine_spec.yaml``, ``<out>/model_specs.yaml`` (profile entries for this role on the ``trtllm``
   and ``openai`` runtimes) and ``<out>/build_manifest.json``.

Runtime ``trt-engine`` (legacy TensorRT engines, TensorRT-LLM <= 1.2.x; Medusa lives only here):

1. ``python $TRTLLM_EXAMPLES/quantization/quantize.py --qformat fp8|full_prec [--kv_cache_dtype fp8]
   [--medusa_model_dir ...]`` to a TensorRT-LLM checkpoint, then
2. ``trtllm-build --checkpoint_dir ... [--speculative_decoding_mode medusa --max_draft_len N]``,
3. ``serve.sh`` (``trtllm-serve ENGINE --backend tensorrt``), ``legacy_triton_params.json`` (parameters of
   Triton's legacy ``tensorrt_llm`` model), the spec copy and the manifest.

Runtime ``portable`` needs no build (the spec and manifest are written for the record).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .engine_specs import ENGINES_DIR, EngineSpec, dump_spec, llm_api_options, load_spec, with_runtime

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPTS = REPO / "build_scripts"
#: Where the legacy quantize.py lives on the build host (the TensorRT-LLM examples folder).
TRTLLM_EXAMPLES_ENV = "TRTLLM_EXAMPLES"


@dataclass(frozen=True)
class Command:
    """A process to run. ``requires``: executables (``exe:NAME``) or files (``file:PATH``) it needs."""

    argv: tuple[str, ...]
    purpose: str
    env: dict[str, str] = field(default_factory=dict)
    requires: tuple[str, ...] = ()

    def shell(self) -> str:
        pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (pre + " " if pre else "") + shlex.join(self.argv)


@dataclass(frozen=True)
class WriteFile:
    """A file to write (text)."""

    path: Path
    content: str
    purpose: str
    executable: bool = False


Step = Command | WriteFile


@dataclass
class BuildPlan:
    spec: EngineSpec
    out_dir: Path
    checkpoint: str
    steps: list[Step]

    def render(self) -> str:
        """Human-readable plan: every command (shell form) and every file with its full content."""
        lines = [f"build plan for {self.spec.name} (role {self.spec.role}, runtime {self.spec.runtime})",
                 f"source checkpoint: {self.checkpoint}", f"output folder:     {self.out_dir}", ""]
        for i, step in enumerate(self.steps, 1):
            if isinstance(step, Command):
                lines += [f"[{i}] run: {step.purpose}", f"    $ {step.shell()}"]
                if step.requires:
                    lines.append(f"    needs: {', '.join(step.requires)}")
            else:
                lines += [f"[{i}] write {step.path} ({len(step.content.encode())} bytes): {step.purpose}"]
                lines += ["    | " + ln for ln in step.content.rstrip("\n").splitlines()]
            lines.append("")
        return "\n".join(lines)


def models_dir() -> Path:
    """Where downloaded checkpoints live on a serving host: ``$LOOKAHEAD_MODELS_DIR`` or ``/models``."""
    return Path(os.environ.get("LOOKAHEAD_MODELS_DIR", "/models"))


def resolve_checkpoint(name: str) -> str:
    """A local folder for ``name`` if one exists (as given, under the engines directory, or as
    ``<models dir>/<last part of the id>``, e.g. ``/models/Qwen3-32B`` for ``Qwen/Qwen3-32B``), else ``name``
    unchanged (a Hugging Face id, loaded from the hub or its cache on the build host)."""
    for cand in (Path(name), ENGINES_DIR / name, models_dir() / Path(name).name):
        if cand.is_dir():
            return str(cand.resolve())
    return name


def _python() -> str:
    return sys.executable or "python3"


def _quantize_command(spec: EngineSpec, checkpoint: str, out: Path, eval_problems: int) -> Command:
    p, c = spec.precision, spec.precision.calibration
    argv = [_python(), str(BUILD_SCRIPTS / "quantize_fp8.py"), "--model", checkpoint, "--out", str(out),
            "--dtype", p.dtype, "--weights", p.weights, "--kv-cache", p.kv_cache,
            "--calib-dataset", c.dataset, "--calib-samples", str(c.samples), "--calib-max-seq-len",
            str(c.max_seq_len), "--calib-seed", str(c.seed)]
    if spec.trust_remote_code:
        argv.append("--trust-remote-code")
    if eval_problems:
        argv += ["--eval-problems", str(eval_problems)]
    what = " + ".join(x for x, on in (("FP8 weights", p.weights == "fp8"), ("FP8 KV-cache scales", p.kv_cache == "fp8"))
                      if on)
    return Command(tuple(argv), f"ModelOpt post-training quantization ({what}) -> Hugging Face FP8 checkpoint",
                   requires=(f"file:{BUILD_SCRIPTS / 'quantize_fp8.py'}",))


def _serve_script(spec: EngineSpec, model: str, extra: list[str]) -> str:
    lines = ["#!/usr/bin/env bash",
             f"# trtllm-serve for {spec.name} ({spec.role}); generated by `lookahead-reasoning build`.",
             "# One OpenAI-compatible server per replica; health: GET /health; API: /v1/completions.",
             "set -euo pipefail", 'HOST="${HOST:-0.0.0.0}"']
    for r in range(spec.replicas):
        gpus = ",".join(str(g) for g in spec.replica_gpus(r))
        argv = ["trtllm-serve", model, "--port", str(spec.port + r)] + extra
        lines.append(f"CUDA_VISIBLE_DEVICES={gpus} {shlex.join(argv)} --host \"$HOST\" &")
    lines += ["wait", ""]
    return "\n".join(lines)


def _model_specs(spec: EngineSpec, model: str) -> str:
    """Profile entries (:class:`~lookahead_reasoning.profiles.ModelSpec`) for this role."""
    spec_file = str(spec.build_dir() / "engine_spec.yaml")
    doc = {
        "in_process_trtllm": {"path": model, "runtime": "trtllm", "spec": spec_file},
        "openai_client": {"path": model, "runtime": "openai", "url": f"http://127.0.0.1:{spec.port}",
                          "server_flavor": "trtllm-serve"},
    }
    head = (f"# Profile entries for role {spec.role!r} ({spec.name}); paste one under `{spec.role}:` in a profile\n"
            "# YAML (lookahead-reasoning --config FILE). `path` must be a local folder with the tokenizer.\n")
    return head + yaml.safe_dump(doc, sort_keys=False)


def _plan_llmapi(spec: EngineSpec, checkpoint: str, out: Path, eval_problems: int) -> list[Step]:
    steps: list[Step] = []
    model = checkpoint
    if spec.precision.needs_quantization:
        model = str(out / "checkpoint")
        steps.append(_quantize_command(spec, checkpoint, out / "checkpoint", eval_problems))
    opts = llm_api_options(spec)
    head = (f"# LLM-API options for {spec.name}: tensorrt_llm.LLM(model, **options) and\n"
            f"#   trtllm-serve {model} --config llm_api_options.yaml\n"
            "# (TensorRT-LLM < 1.2 names the flag --extra_llm_api_options). Generated from engine_spec.yaml.\n")
    steps.append(WriteFile(out / "llm_api_options.yaml", head + yaml.safe_dump(opts, sort_keys=False),
                           "LLM-API / trtllm-serve options"))
    steps.append(WriteFile(out / "serve.sh", _serve_script(spec, model, ["--backend", "pytorch", "--config",
                                                                        str(out / "llm_api_options.yaml")]),
                           "start trtllm-serve (one per replica)", executable=True))
    steps.append(WriteFile(out / "model_specs.yaml", _model_specs(spec, model), "profile entries for this role"))
    return steps


def check_medusa_checkpoint(d) -> None:
    """Where ``d.checkpoint`` (a :class:`~.engine_specs.MedusaDrafting`'s) is a local folder, check it is what
    ``quantize.py --medusa_model_dir`` reads (``tensorrt_llm/models/medusa/weight.py::load_medusa_hf``:
    ``medusa_lm_head.pt`` or ``.safetensors``; FasterDecoding's ``config.json``) with at least ``num_heads`` heads
    of ``num_layers`` blocks. A path that is not here (a production host's) is left to the build.

    Raises:
        ValueError: naming ``drafting.checkpoint``, ``drafting.num_heads`` or ``drafting.num_layers``.
    """
    folder = Path(d.checkpoint)
    if not folder.is_dir():
        return
    if not any((folder / f).is_file() for f in ("medusa_lm_head.pt", "medusa_lm_head.safetensors")):
        raise ValueError(f"drafting.checkpoint: {folder} holds no medusa_lm_head.pt or medusa_lm_head.safetensors")
    try:
        cfg = json.loads((folder / "config.json").read_text())
        heads, layers = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"drafting.checkpoint: {folder}/config.json does not give medusa_num_heads ({exc})") from None
    if d.num_heads > heads:
        raise ValueError(f"drafting.num_heads: {d.num_heads} is more than the checkpoint's {heads} heads")
    if d.num_layers != layers:
        raise ValueError(f"drafting.num_layers: {d.num_layers}, but the checkpoint's heads have {layers} blocks")


def _plan_trt_engine(spec: EngineSpec, checkpoint: str, out: Path) -> list[Step]:
    p, lim, d = spec.precision, spec.limits, spec.drafting
    examples = os.environ.get(TRTLLM_EXAMPLES_ENV, "/app/tensorrt_llm/examples")
    quantize = str(Path(examples) / "quantization" / "quantize.py")
    ckpt = out / "tllm_checkpoint"
    argv = [_python(), quantize, "--model_dir", checkpoint, "--output_dir", str(ckpt), "--dtype", p.dtype,
            "--qformat", "fp8" if p.weights == "fp8" else "full_prec",
            "--tp_size", str(spec.parallel.tensor), "--pp_size", str(spec.parallel.pipeline),
            "--calib_size", str(p.calibration.samples), "--calib_max_seq_length", str(p.calibration.max_seq_len)]
    if p.kv_cache == "fp8":
        argv += ["--kv_cache_dtype", "fp8"]
    if p.calibration.dataset != "synthetic":
        argv += ["--calib_dataset", p.calibration.dataset]
    if d.method == "medusa":
        check_medusa_checkpoint(d)  # type: ignore[arg-type]
        argv += ["--medusa_model_dir", d.checkpoint, "--num_medusa_heads", str(d.num_heads),  # type: ignore[union-attr]
                 "--num_medusa_layers", str(d.num_layers), "--max_draft_len", str(d.max_draft_len)]  # type: ignore[union-attr]
        if p.weights == "fp8":
            argv.append("--quant_medusa_head")
    steps: list[Step] = [Command(tuple(argv), "legacy checkpoint conversion / quantization (examples/quantization/"
                                 "quantize.py, TensorRT-LLM <= 1.2.x)", requires=(f"file:{quantize}",))]
    build = ["trtllm-build", "--checkpoint_dir", str(ckpt), "--output_dir", str(out / "engine"),
             "--gemm_plugin", "auto", "--max_batch_size", str(lim.max_batch_size), "--max_input_len",
             str(lim.max_input_len), "--max_seq_len", str(lim.max_seq_len), "--max_num_tokens", str(lim.max_num_tokens),
             "--use_paged_context_fmha", "enable", "--workers", str(spec.parallel.world_size)]
    if p.kv_cache == "fp8":
        build += ["--use_fp8_context_fmha", "enable"]
    if d.method == "medusa":
        build += ["--speculative_decoding_mode", "medusa", "--max_draft_len", str(d.max_draft_len)]  # type: ignore[union-attr]
    steps.append(Command(tuple(build), "build the TensorRT engine (legacy trtllm-build)",
                         requires=("exe:trtllm-build",)))
    steps.append(WriteFile(out / "serve.sh", _serve_script(spec, str(out / "engine"),
                                                           ["--backend", "tensorrt", "--tokenizer", checkpoint]),
                           "start trtllm-serve on the engine (TensorRT-LLM <= 1.2.x)", executable=True))
    params = {
        "gpt_model_path": str(out / "engine"), "gpt_model_type": "inflight_fused_batching",
        "batch_scheduler_policy": "max_utilization",
        "kv_cache_free_gpu_mem_fraction": str(spec.kv_cache.free_gpu_memory_fraction),
        "enable_kv_cache_reuse": str(spec.kv_cache.enable_block_reuse).lower(), "max_beam_width": "1",
        "decoding_mode": "medusa" if d.method == "medusa" else "top_k_top_p",
    }
    if d.method == "medusa" and d.choices is not None:  # type: ignore[union-attr]
        params["medusa_choices"] = json.dumps(d.choices)  # type: ignore[union-attr]
    steps.append(WriteFile(out / "legacy_triton_params.json", json.dumps(params, indent=2) + "\n",
                           "parameters of Triton's legacy `tensorrt_llm` model (tensorrtllm_backend <= 1.2.x)"))
    return steps


def plan_build(spec: EngineSpec, out_dir: str | Path | None = None, checkpoint: str | None = None,
               eval_problems: int = 0) -> BuildPlan:
    """Every step of building ``spec`` (nothing is run).

    Args:
        out_dir: build folder (default ``spec.build_dir()``).
        checkpoint: source checkpoint (default ``spec.checkpoint``, resolved to a local folder when one exists).
        eval_problems: also evaluate the FP8 checkpoint against the original on this many held-out problems
            (portable engine, dequantized weights; small models only).
    """
    out = Path(out_dir) if out_dir else spec.build_dir()
    if out_dir:
        spec = spec.model_copy(update={"output_dir": str(out.resolve())})
    ckpt = resolve_checkpoint(checkpoint or spec.checkpoint)
    if spec.runtime == "llmapi":
        steps = _plan_llmapi(spec, ckpt, out, eval_problems)
    elif spec.runtime == "trt-engine":
        steps = _plan_trt_engine(spec, ckpt, out)
    else:
        steps = []
    steps.append(WriteFile(out / "engine_spec.yaml", dump_spec(spec), "the validated spec this build used"))
    manifest = {
        "spec": spec.name, "role": spec.role, "runtime": spec.runtime, "source_checkpoint": ckpt,
        "served_checkpoint": spec.served_checkpoint() if spec.runtime != "portable" else ckpt,
        "steps": [s.shell() if isinstance(s, Command) else f"write {s.path}" for s in steps],
    }
    steps.append(WriteFile(out / "build_manifest.json", json.dumps(manifest, indent=2) + "\n", "what was built"))
    return BuildPlan(spec, out, ckpt, steps)


def missing_requirements(plan: BuildPlan) -> list[str]:
    """Requirements of the plan's commands that this host lacks (``exe:`` not on PATH, ``file:`` absent)."""
    missing = []
    for i, step in enumerate(plan.steps, 1):
        if not isinstance(step, Command):
            continue
        for req in step.requires:
            kind, _, what = req.partition(":")
            ok = shutil.which(what) is not None if kind == "exe" else Path(what).exists()
            if not ok:
                missing.append(f"step {i} ({step.argv[0] if kind == 'exe' else Path(step.argv[1]).name}) needs "
                               f"{'`' + what + '` on PATH' if kind == 'exe' else what}")
    return missing


def execute_plan(plan: BuildPlan, log=print) -> None:
    """Run the plan's steps in order.

    Raises:
        RuntimeError: a requirement is missing (before anything runs) or a command fails (naming the step).
    """
    missing = missing_requirements(plan)
    if missing:
        hint = (" The legacy engine path needs TensorRT-LLM <= 1.2.x (trtllm-build, examples/quantization; set "
                f"${TRTLLM_EXAMPLES_ENV}), e.g. inside its NGC container." if plan.spec.runtime == "trt-engine" else "")
        raise RuntimeError("build: cannot run on this host: " + "; ".join(missing) + "." + hint
                           + " Use --dry-run to print the commands.")
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    for i, step in enumerate(plan.steps, 1):
        if isinstance(step, Command):
            log(f"[{i}/{len(plan.steps)}] {step.purpose}\n    $ {step.shell()}")
            t0 = time.perf_counter()
            proc = subprocess.run(list(step.argv), env={**os.environ, **step.env})
            if proc.returncode != 0:
                raise RuntimeError(f"build: step {i} failed with exit status {proc.returncode}: {step.shell()}")
            log(f"    done in {time.perf_counter() - t0:.1f} s")
        else:
            step.path.parent.mkdir(parents=True, exist_ok=True)
            step.path.write_text(step.content)
            if step.executable:
                step.path.chmod(0o755)
            log(f"[{i}/{len(plan.steps)}] wrote {step.path}")


def cmd_build(args) -> int:
    """Handler of ``lookahead-reasoning build``."""
    spec = load_spec(args.spec)
    if args.runtime and args.runtime != spec.runtime:
        spec = with_runtime(spec, args.runtime)
    if args.eval_problems is not None and args.eval_problems < 0:
        raise ValueError("--eval-problems: must be >= 0")
    plan = plan_build(spec, args.out, args.checkpoint, args.eval_problems or 0)
    if args.dry_run:
        print(plan.render())
        return 0
    try:
        execute_plan(plan, log=lambda s: print(s, file=sys.stderr))
    except RuntimeError as exc:
        print(f"lookahead-reasoning build: error: {exc}", file=sys.stderr)
        return 1
    print(str(plan.out_dir))
    return 0


def register(subparsers) -> None:
    """Add the ``build`` subcommand to the CLI's subparsers."""
    b = subparsers.add_parser("build", help="build served artifacts from an engine spec (engines/*.yaml)",
                              description=__doc__.split("\n\n")[0])
    b.add_argument("--spec", required=True, help="engine spec YAML (engines/*.yaml)")
    b.add_argument("--dry-run", action="store_true", help="print every command and file; run and write nothing")
    b.add_argument("--runtime", choices=["llmapi", "trt-engine"], default=None,
                   help="override the spec's runtime (re-validated)")
    b.add_argument("--out", default=None, help="build folder (default engines/built/<name>)")
    b.add_argument("--checkpoint", default=None, help="source checkpoint folder (default: the spec's checkpoint)")
    b.add_argument("--eval-problems", type=int, default=None,
                   help="after FP8 quantization, compare accuracy on N held-out problems (small models, CPU)")
    b.set_defaults(func=cmd_build)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python build_scripts/build_engine.py``), same arguments as ``lookahead-reasoning build``."""
    import argparse

    parser = argparse.ArgumentParser(prog="build_engine.py")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["build", *(argv if argv is not None else sys.argv[1:])])
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"build: error: {exc}", file=sys.stderr)
        return 2


__all__ = ["BuildPlan", "Command", "WriteFile", "cmd_build", "execute_plan", "missing_requirements", "models_dir",
           "plan_build", "register", "resolve_checkpoint"]
