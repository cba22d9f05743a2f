"""The TensorRT-LLM backend without TensorRT-LLM (it cannot be installed here; nothing is faked).

Checked: importing the backend does not import ``tensorrt_llm``; creating an engine fails with an
ImportError naming the package; the pure functions that map our specs and requests to LLM-API arguments
(``LLM(...)``, ``SamplingParams(...)``, the GPU environment) give the documented arguments; the text-level
stop handling the backend applies to streamed tokens; the production profiles that use the backend load.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from lookahead_reasoning.backends.base import GenerationRequest, SamplingParams, finish_generation, first_stop_end
from lookahead_reasoning.backends.trtllm import (
    DECODING_CLASSES,
    gpu_environment,
    llm_constructor_args,
    sampling_kwargs,
)
from lookahead_reasoning.production.engine_specs import load_spec, spec_from_dict

REPO = Path(__file__).resolve().parents[1]
HAVE_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None
no_trtllm = pytest.mark.skipif(HAVE_TRTLLM, reason="tensorrt_llm is installed here")

#: Documented fields (TensorRT-LLM llm-api reference pages).
KV_FIELDS = {"free_gpu_memory_fraction", "enable_block_reuse", "dtype", "tokens_per_block"}
CUDA_GRAPH_FIELDS = {"batch_sizes", "max_batch_size", "enable_padding"}
DECODING_FIELDS = {
    "NGram": {"max_draft_len", "max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"},
    "Eagle3": {"max_draft_len", "speculative_model_dir", "eagle3_one_model"},
    "Draft_Target": {"max_draft_len", "speculative_model_dir"},
}
SAMPLING_FIELDS = {"max_tokens", "end_id", "pad_id", "seed", "stop", "stop_token_ids", "include_stop_str_in_output",
                   "temperature", "top_p", "top_k"}


def spec(**over):
    d = {"name": "t", "role": "target", "checkpoint": "Qwen/Qwen3-32B"}
    d.update(over)
    return spec_from_dict(d)


@no_trtllm
def test_import_does_not_load_tensorrt_llm():
    code = ("import sys, lookahead_reasoning.backends.trtllm, lookahead_reasoning.backends; "
            "assert 'tensorrt_llm' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@no_trtllm
def test_engine_creation_names_the_missing_package(tiny_model_dir):
    from lookahead_reasoning.backends.trtllm import TrtllmEngine

    with pytest.raises(ImportError, match=r"`tensorrt-llm`") as info:
        TrtllmEngine(spec(), model=str(tiny_model_dir))
    assert "import tensorrt_llm" in str(info.value)


@no_trtllm
def test_make_engine_trtllm_runtime(tiny_model_dir):
    from lookahead_reasoning.backends import make_engine
    from lookahead_reasoning.profiles import ModelSpec

    with pytest.raises(ValueError, match="spec: runtime 'trtllm' needs `spec`"):
        make_engine(ModelSpec(path=str(tiny_model_dir), runtime="trtllm"))
    with pytest.raises(ImportError, match="tensorrt-llm"):
        make_engine(ModelSpec(path=str(tiny_model_dir), runtime="trtllm",
                              spec=str(REPO / "engines" / "qwen3-1.7b-draft.yaml")))
    with pytest.raises(FileNotFoundError, match="no such file"):
        make_engine(ModelSpec(path=str(tiny_model_dir), runtime="trtllm", spec="missing.yaml"))


def test_legacy_spec_is_refused_before_import():
    from lookahead_reasoning.backends.trtllm import TrtllmEngine

    legacy = load_spec(REPO / "engines" / "deepseek-r1-distill-qwen-32b-target-medusa.yaml")
    with pytest.raises(ValueError, match="runtime: the TensorRT-LLM backend serves 'llmapi' specs"):
        TrtllmEngine(legacy)


LLMAPI_SPECS = [p for p in sorted((REPO / "engines").glob("*.yaml")) if load_spec(p).runtime == "llmapi"]


@pytest.mark.parametrize("path", LLMAPI_SPECS, ids=[p.stem for p in LLMAPI_SPECS])
def test_llm_constructor_args_of_shipped_specs(path):
    s = load_spec(path)
    args = llm_constructor_args(s, "/models/x")
    assert args["model"] == "/models/x" and args["tokenizer"] == "/models/x"
    assert args["tensor_parallel_size"] * args["pipeline_parallel_size"] == len(s.replica_gpus(0))
    assert set(args["kv_cache_config"]) <= KV_FIELDS
    assert args["kv_cache_config"]["enable_block_reuse"] is True
    assert args["kv_cache_config"]["dtype"] == ("fp8" if s.precision.kv_cache == "fp8" else "auto")
    if args["cuda_graph_config"] is not None:
        assert set(args["cuda_graph_config"]) <= CUDA_GRAPH_FIELDS
    sc = args.get("speculative_config")
    if s.drafting.method == "none":
        assert sc is None
    else:
        assert sc["decoding_type"] in DECODING_CLASSES
        assert set(sc) - {"decoding_type"} <= DECODING_FIELDS[sc["decoding_type"]]
        assert sc["max_draft_len"] == s.drafting.max_draft_len


def test_reference_ngram_setting_maps_to_ngram_config():
    s = load_spec(REPO / "engines" / "qwen3-32b-target.yaml")
    sc = llm_constructor_args(s, "m")["speculative_config"]
    # The reference LR defaults: n-gram SD with 6 speculative tokens and prompt_lookup_max 2.
    assert sc == {"decoding_type": "NGram", "max_draft_len": 6, "max_matching_ngram_size": 2, "is_keep_all": True,
                  "is_use_oldest": True, "is_public_pool": True}


def test_sampling_kwargs_greedy_and_sampled():
    eos = frozenset({151645, 151643})
    greedy = sampling_kwargs(GenerationRequest((1, 2, 3), 100, stop=("\n\n",)), eos, 151645, 151643)
    assert set(greedy) <= SAMPLING_FIELDS
    assert greedy["top_k"] == 1 and "temperature" not in greedy and "top_p" not in greedy
    assert greedy["max_tokens"] == 100 and greedy["stop"] == ["\n\n"] and greedy["include_stop_str_in_output"]
    assert greedy["end_id"] == 151645 and greedy["stop_token_ids"] == [151643] and greedy["seed"] is None
    sampled = sampling_kwargs(GenerationRequest((1,), 7, sampling=SamplingParams(temperature=0.6, top_p=0.95,
                                                                                 top_k=20, seed=11)),
                              frozenset({2}), 2, 0)
    assert sampled == {"max_tokens": 7, "end_id": 2, "pad_id": 0, "seed": 11, "temperature": 0.6, "top_p": 0.95,
                       "top_k": 20}
    full = sampling_kwargs(GenerationRequest((1,), 7, sampling=SamplingParams(temperature=1.0)), frozenset({2}), 2, 0)
    # top_p / top_k are explicit even when "off": None would mean the runtime default (greedy in the LLM API).
    assert full["top_p"] == 1.0 and full["top_k"] == 0


def test_gpu_environment():
    s = spec(parallel={"tensor": 2}, gpus=[4, 5, 6, 7])
    assert gpu_environment(s, 0, environ={}) == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert gpu_environment(s, 1, environ={}) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert gpu_environment(s, 0, environ={"CUDA_VISIBLE_DEVICES": "0"}) == {}
    assert gpu_environment(s, 0, environ={"LOOKAHEAD_PIN_GPUS": "0"}) == {}
    with pytest.raises(ValueError, match="replica"):
        gpu_environment(s, 2, environ={})


def test_text_level_stop_handling(tiny_model_dir):
    """Stops are found on decoded text, so a stop string inside a larger token still ends the output there."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    ids = tok.encode("Step 1: 4 + 4 = 8.\n\nStep 2: 8 + 1 = 9.\n\n#### 9")
    k = first_stop_end(ids, ["\n\n"], decode)
    assert "\n\n" in decode(ids[:k]) and "\n\n" not in decode(ids[:k - 1])
    assert first_stop_end(ids, ["zzz"], decode) is None
    eos = frozenset({tok.eos_token_id})
    out, why = finish_generation(ids, max_new_tokens=100, stop=["\n\n"], eos_token_ids=eos, decode=decode)
    assert (out, why) == (ids[:k], "stop")
    with_eos = ids[:3] + [tok.eos_token_id] + ids[3:]
    assert finish_generation(with_eos, max_new_tokens=100, stop=["#### "], eos_token_ids=eos,
                             decode=decode) == (with_eos[:4], "eos")
    assert finish_generation(ids, max_new_tokens=5, stop=[], eos_token_ids=eos, decode=decode) == (ids[:5], "length")
    assert finish_generation(ids[:5], max_new_tokens=50, stop=[], eos_token_ids=eos, decode=decode,
                             server_finish="length") == (ids[:5], "length")
    assert finish_generation(ids[:5], max_new_tokens=50, stop=[], eos_token_ids=eos, decode=decode,
                             server_finish="stop") == (ids[:5], "stop")


@pytest.mark.parametrize("name", ["qwen3-trtllm", "qwen3-openai"])
def test_production_profiles_load(name):
    from lookahead_reasoning.production.engine_specs import ENGINES_DIR
    from lookahead_reasoning.profiles import load_profile

    p = load_profile(config=REPO / "engines" / "profiles" / f"{name}.yaml")
    for role in ("target", "draft", "judge"):
        m = getattr(p, role)
        if m.runtime == "trtllm":
            s = load_spec(ENGINES_DIR / m.spec)
            assert s.role == role and s.runtime == "llmapi"
        else:
            assert m.runtime == "openai" and m.url and m.server_flavor == "trtllm-serve"
    assert p.options.gamma == 4 and p.options.sampling.temperature == 0.6
