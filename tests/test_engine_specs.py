"""Engine specs (engines/*.yaml): validation, YAML round trip, the LLM-API options, and the build plan
(``lookahead-reasoning build --dry-run``) of every shipped spec; a real FP8 build of a tiny model on CPU."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from lookahead_reasoning.production.engine_build import Command, WriteFile, plan_build, register
from lookahead_reasoning.production.engine_build import main as build_main
from lookahead_reasoning.production.engine_specs import (
    EngineSpec,
    dump_spec,
    llm_api_options,
    load_spec,
    spec_from_dict,
    with_runtime,
)

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p for p in (REPO / "engines").glob("*.yaml"))
LLMAPI_KEYS = {  # TorchLlmArgs fields we set (TensorRT-LLM llm-api reference, `LLM` / BaseLlmArgs)
    "dtype", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_input_len", "max_seq_len",
    "max_num_tokens", "kv_cache_config", "trust_remote_code", "cuda_graph_config", "speculative_config",
    "disable_overlap_scheduler",
}


def base(**over) -> dict:
    d = {"name": "t", "role": "target", "checkpoint": "Qwen/Qwen3-32B", "runtime": "llmapi"}
    d.update(over)
    return d


def test_shipped_specs_exist():
    names = {p.stem for p in SHIPPED}
    for want in ("qwen3-32b-target", "qwen3-1.7b-draft", "qwen2.5-7b-judge", "deepseek-r1-distill-qwen-32b-target",
                 "deepseek-r1-distill-qwen-1.5b-draft"):
        assert want in names


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_spec_round_trips(path, tmp_path):
    spec = load_spec(path)
    assert spec.name == path.stem
    text = dump_spec(spec)
    (tmp_path / "again.yaml").write_text(text)
    again = load_spec(tmp_path / "again.yaml")
    assert again == spec
    assert dump_spec(again) == text


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_dry_run_of_every_shipped_spec(path, tmp_path, capsys):
    out = tmp_path / "build"
    assert build_main(["--spec", str(path), "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert not out.exists(), "a dry run writes nothing"
    spec = load_spec(path)
    plan = plan_build(spec, out)
    # Every command and every file of the plan is printed, files with their full content.
    for step in plan.steps:
        if isinstance(step, Command):
            assert step.shell() in printed
        else:
            assert str(step.path) in printed
            for line in step.content.splitlines():
                assert line.rstrip() in printed
    files = {s.path.name: s for s in plan.steps if isinstance(s, WriteFile)}
    cmds = [s for s in plan.steps if isinstance(s, Command)]
    assert load_spec_text(files["engine_spec.yaml"].content, tmp_path) == spec.model_copy(
        update={"output_dir": str(out.resolve())})
    manifest = json.loads(files["build_manifest.json"].content)
    assert manifest["spec"] == spec.name and manifest["runtime"] == spec.runtime
    if spec.runtime == "llmapi":
        opts = yaml.safe_load(files["llm_api_options.yaml"].content)
        assert opts == llm_api_options(spec)
        assert set(opts) <= LLMAPI_KEYS
        assert opts["kv_cache_config"]["enable_block_reuse"] is True
        assert opts["tensor_parallel_size"] == spec.parallel.tensor
        serve = files["serve.sh"].content
        assert "trtllm-serve" in serve and f"--port {spec.port}" in serve
        assert f"CUDA_VISIBLE_DEVICES={','.join(map(str, spec.gpus))}" in serve
        if spec.precision.needs_quantization:
            q = cmds[0].argv
            assert Path(q[1]).name == "quantize_fp8.py"
            assert q[q.index("--weights") + 1] == spec.precision.weights
            assert q[q.index("--kv-cache") + 1] == spec.precision.kv_cache
            assert q[q.index("--out") + 1] == str(out / "checkpoint")
            assert f"trtllm-serve {out / 'checkpoint'}" in serve
        else:
            assert not cmds
    elif spec.runtime == "trt-engine":
        quantize, build = cmds
        assert Path(quantize.argv[1]).name == "quantize.py"
        assert "--qformat" in quantize.argv and build.argv[0] == "trtllm-build"
        if spec.drafting.method == "medusa":
            assert "--medusa_model_dir" in quantize.argv
            assert shlex.join(["--speculative_decoding_mode", "medusa"]) in build.shell()
        assert "--backend tensorrt" in files["serve.sh"].content


def load_spec_text(text: str, tmp_path: Path) -> EngineSpec:
    p = tmp_path / "x.yaml"
    p.write_text(text)
    return load_spec(p)


@pytest.mark.parametrize(
    "data, field, words",
    [
        (base(runtime="llmapi", drafting={"method": "medusa", "checkpoint": "/m"}), "drafting.method",
         "legacy TensorRT engine path"),
        (base(runtime="trt-engine", drafting={"method": "eagle3", "checkpoint": "/e"}), "drafting.method",
         "PyTorch runtime only"),
        (base(runtime="trt-engine", drafting={"method": "ngram"}), "drafting.method", "PyTorch runtime only"),
        (base(runtime="portable", drafting={"method": "eagle3", "checkpoint": "/e"}), "drafting.method", "llmapi"),
        (base(parallel={"tensor": 2}, gpus=[0, 1, 2]), "parallel.tensor", "does not divide"),
        (base(parallel={"tensor": 4}, gpus=[0, 1]), "parallel.tensor", "does not divide"),
        (base(runtime="portable", checkpoint="demo/target", precision={"kv_cache": "fp8"}), "precision.kv_cache",
         "FP8 KV cache needs runtime llmapi or trt-engine"),
        (base(runtime="portable", checkpoint="demo/target", precision={"weights": "fp8"}), "precision.weights",
         "no FP8 kernels"),
        (base(runtime="portable", parallel={"tensor": 2}, gpus=[0, 1]), "parallel.tensor", "one device"),
        (base(precision={"kv_cache": "fp8"}, gpu_compute_capability=8.0), "precision.kv_cache", "compute capability"),
        (base(precision={"weights": "fp8"}, gpu_compute_capability=8.6), "precision.weights", "compute capability"),
        (base(role="judge", drafting={"method": "ngram"}), "drafting.method", "judge reads ONE token"),
        (base(limits={"max_batch_size": 8}, cuda_graphs={"max_batch_size": 16}), "cuda_graphs.max_batch_size",
         "exceeds limits.max_batch_size"),
        (base(limits={"max_input_len": 4096, "max_seq_len": 4096}), "limits.max_input_len", "must be <"),
        (base(kv_cache={"tokens_per_block": 48}), "kv_cache.tokens_per_block", "power of two"),
        (base(kv_cache={"free_gpu_memory_fraction": 1.5}), "kv_cache.free_gpu_memory_fraction", "less than or equal"),
        (base(drafting={"method": "eagle3"}), "drafting.eagle3.checkpoint", "Field required"),
        (base(drafting={"method": "lookahead"}), "drafting", "does not match any of the expected tags"),
        (base(gpus=[0, 0]), "gpus", "distinct"),
        (base(gpus=[]), "gpus", "at least one"),
        (base(name="Bad Name"), "name", "slug"),
        (base(precison={"weights": "fp8"}), "precison", "Extra inputs are not permitted"),
        (base(runtime="tensorrt"), "runtime", "Input should be"),
        (base(precision={"weights": "int4"}), "precision.weights", "Input should be"),
    ],
)
def test_invalid_specs_name_the_field(data, field, words):
    with pytest.raises(ValueError) as info:
        spec_from_dict(data, "test.yaml")
    msg = str(info.value)
    assert msg.startswith(field + ":") or f"{field}:" in msg, msg
    assert words in msg, msg
    assert "(in test.yaml)" in msg


def test_valid_combinations_and_derived_values():
    s = spec_from_dict(base(parallel={"tensor": 2}, gpus=[0, 1, 2, 3]))
    assert s.replicas == 2 and s.replica_gpus(1) == [2, 3]
    with pytest.raises(ValueError, match="replica"):
        s.replica_gpus(2)
    medusa = spec_from_dict(base(runtime="trt-engine", drafting={"method": "medusa", "checkpoint": "/m"}))
    assert medusa.served_checkpoint().endswith("engine")
    portable = spec_from_dict(base(runtime="portable", checkpoint="demo/target", drafting={"method": "ngram"},
                                   gpu_compute_capability=7.5))
    assert portable.served_checkpoint() == "demo/target"
    fp8 = spec_from_dict(base(precision={"weights": "fp8"}))
    assert fp8.served_checkpoint().endswith("built/t/checkpoint")
    assert spec_from_dict(base()).served_checkpoint() == "Qwen/Qwen3-32B"


def test_runtime_override_revalidates():
    medusa = load_spec(REPO / "engines" / "deepseek-r1-distill-qwen-32b-target-medusa.yaml")
    with pytest.raises(ValueError, match=r"drafting.method: 'medusa' is not available with runtime 'llmapi'"):
        with_runtime(medusa, "llmapi")
    ngram = load_spec(REPO / "engines" / "qwen3-32b-target.yaml")
    with pytest.raises(ValueError, match="drafting.method"):
        with_runtime(ngram, "trt-engine")
    with pytest.raises(ValueError, match="runtime: unknown runtime"):
        with_runtime(ngram, "vllm")
    plain = spec_from_dict(base(precision={"weights": "fp8", "kv_cache": "fp8"}))
    legacy = with_runtime(plain, "trt-engine")
    assert legacy.runtime == "trt-engine"
    with pytest.raises(ValueError, match="runtime: LLM-API options exist for runtime 'llmapi'"):
        llm_api_options(legacy)


def test_llm_api_options_mapping():
    s = spec_from_dict(base(
        precision={"kv_cache": "fp8"}, kv_cache={"free_gpu_memory_fraction": 0.5, "tokens_per_block": 64},
        drafting={"method": "eagle3", "checkpoint": "/heads", "max_draft_len": 4, "one_model": False},
        cuda_graphs={"batch_sizes": [4, 1, 2, 2]}, limits={"max_batch_size": 8},
    ))
    o = llm_api_options(s)
    assert o["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5, "enable_block_reuse": True, "dtype": "fp8",
                                    "tokens_per_block": 64}
    assert o["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 4,
                                       "speculative_model_dir": "/heads", "eagle3_one_model": False}
    assert o["cuda_graph_config"] == {"enable_padding": True, "batch_sizes": [1, 2, 4]}
    assert "disable_overlap_scheduler" not in o
    dt = llm_api_options(spec_from_dict(base(drafting={"method": "draft_target", "checkpoint": "/d"},
                                             cuda_graphs={"enabled": False})))
    assert dt["speculative_config"] == {"decoding_type": "Draft_Target", "max_draft_len": 4,
                                        "speculative_model_dir": "/d"}
    assert dt["disable_overlap_scheduler"] is True and dt["cuda_graph_config"] is None
    none = llm_api_options(spec_from_dict(base()))
    assert "speculative_config" not in none and none["kv_cache_config"]["dtype"] == "auto"


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="spec: no such file"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_spec(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ValueError, match="does not hold a mapping"):
        load_spec(bad)


def test_build_cli_registers_and_reports_errors(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["build", "--spec", "x.yaml", "--dry-run", "--runtime", "trt-engine"])
    assert args.dry_run and args.runtime == "trt-engine" and callable(args.func)
    medusa = REPO / "engines" / "deepseek-r1-distill-qwen-32b-target-medusa.yaml"
    assert build_main(["--spec", str(medusa), "--runtime", "llmapi", "--dry-run"]) == 2
    assert "drafting.method: 'medusa' is not available with runtime 'llmapi'" in capsys.readouterr().err
    # A legacy build on a host without TensorRT-LLM stops before running anything, naming what is missing.
    assert build_main(["--spec", str(medusa), "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "`trtllm-build` on PATH" in err and "TensorRT-LLM <= 1.2.x" in err
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_real_fp8_build_of_a_tiny_model(tiny_model_dir, tmp_path):
    """The llmapi build runs for real on CPU: ModelOpt (or the torch fallback) quantizes the tiny Qwen3 to an
    FP8 Hugging Face checkpoint; the options YAML and serve script are written; the dequantized checkpoint runs
    in the portable engine."""
    pytest.importorskip("safetensors")
    spec_path = tmp_path / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(base(
        name="tiny-fp8", checkpoint=str(tiny_model_dir), precision={"dtype": "float16", "weights": "fp8",
                                                                 "calibration": {"samples": 4, "max_seq_len": 64}},
        limits={"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512}, cuda_graphs={"max_batch_size": 4})))
    out = tmp_path / "built"
    assert build_main(["--spec", str(spec_path), "--out", str(out)]) == 0
    ck = out / "checkpoint"
    quant = json.loads((ck / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "FP8" and "lm_head" in quant["exclude_modules"]
    import torch
    from safetensors import safe_open

    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        w = f.get_tensor("model.layers.0.mlp.down_proj.weight")
        s = f.get_tensor("model.layers.0.mlp.down_proj.weight_scale")
        assert w.dtype == torch.float8_e4m3fn and s.numel() == 1
        assert "model.layers.0.self_attn.q_proj.input_scale" in f.keys()
    assert yaml.safe_load((out / "llm_api_options.yaml").read_text())["dtype"] == "float16"
    assert (out / "serve.sh").stat().st_mode & 0o111
    report = json.loads((ck / "fp8_report.json").read_text())
    assert report["backend"].startswith(("modelopt", "torch"))

    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("quantize_fp8", REPO / "build_scripts" / "quantize_fp8.py")
    q = importlib.util.module_from_spec(spec)
    sys.modules["quantize_fp8"] = q
    spec.loader.exec_module(q)
    scales = q.dequantize_checkpoint(ck, tmp_path / "deq", tokenizer_dir=tiny_model_dir)
    assert len(scales) == 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    from lookahead_reasoning.backends.base import GenerationRequest
    from lookahead_reasoning.backends.portable import PortableEngine

    eng = PortableEngine.from_pretrained(str(tmp_path / "deq"), num_threads=1, dtype="float32")
    try:
        assert q.install_input_fake_quant(eng.model, scales) == 14
        res = eng.generate([GenerationRequest(eng.encode("Step 1: 4 + 4 ="), 8)])[0]
        assert 1 <= len(res.token_ids) <= 8
    finally:
        eng.close()
    # The hand-written per-tensor scheme gives the same weight scale as the export: max|W| / 448.
    from safetensors import safe_open as so

    with so(str(Path(tiny_model_dir) / "model.safetensors"), "pt") as f:
        w0 = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    _, s0 = q.fp8_per_tensor(w0)
    assert float(s0) == pytest.approx(float(s), rel=1e-3)


def _container_path(p: str) -> Path:
    assert p.startswith("/app/"), p
    return REPO / p[len("/app/"):]


def test_deployment_files_match_the_specs():
    """docker/ and docker/k8s/ (not run here) point at shipped specs and profiles, give each role as many GPUs as
    its spec's tensor x pipeline size, and health-check the spec's port."""
    import subprocess

    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    roles = 0
    for name, svc in compose["services"].items():
        cmd = svc["command"]
        if cmd[0] == "serve-role":
            roles += 1
            spec = load_spec(_container_path(cmd[1]))
            assert spec.role == name
            devices = svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
            assert len(devices) == spec.parallel.world_size
            assert f"localhost:{spec.port}/health" in " ".join(svc["healthcheck"]["test"])
        else:
            assert cmd[0] == "triton" and _container_path(cmd[1]).exists()
            assert "/v2/health/ready" in " ".join(svc["healthcheck"]["test"])
    assert roles == 3
    single = yaml.safe_load((REPO / "docker" / "compose.single.yaml").read_text())
    (trio,) = single["services"].values()
    assert _container_path(trio["command"][1]).exists()
    for doc in yaml.safe_load_all((REPO / "docker" / "k8s" / "lookahead-split.yaml").read_text()):
        if doc["kind"] == "Deployment":
            c = doc["spec"]["template"]["spec"]["containers"][0]
            if c["args"][0] == "serve-role":
                spec = load_spec(_container_path(c["args"][1]))
                assert c["resources"]["limits"]["nvidia.com/gpu"] == spec.parallel.world_size
                assert c["ports"][0]["containerPort"] == spec.port
    trio_k8s = next(yaml.safe_load_all((REPO / "docker" / "k8s" / "lookahead-trio.yaml").read_text()))
    c = trio_k8s["spec"]["template"]["spec"]["containers"][0]
    from lookahead_reasoning.profiles import load_profile

    prof = load_profile(config=_container_path(c["args"][1]))
    gpus = set()
    for role in ("target", "draft", "judge"):
        gpus |= set(load_spec(REPO / "engines" / getattr(prof, role).spec).gpus)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == len(gpus)
    assert subprocess.run(["bash", "-n", str(REPO / "docker" / "entrypoint.sh")]).returncode == 0


def test_calibration_refuses_a_held_out_seed():
    """FP8 calibration never sees evaluation problems: the quantization script refuses the held-out seeds."""
    import importlib.util

    from lookahead_reasoning.evaluation.synthetic import EVAL_SEED

    spec = importlib.util.spec_from_file_location("quantize_fp8_seed", REPO / "build_scripts" / "quantize_fp8.py")
    q = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(q)
    with pytest.raises(ValueError, match="held-out"):
        q.calibration_ids(None, "synthetic", 4, 64, EVAL_SEED)
