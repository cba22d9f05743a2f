"""Engine backend on TensorRT-LLM's LLM API (PyTorch runtime), built from an engine spec (``engines/*.yaml``).

NOT RUN IN CI: TensorRT-LLM needs NVIDIA GPUs and CUDA (``import tensorrt_llm`` loads ``libcuda.so.1``); it
cannot be installed on the project's machines. This module is written against the documented API (see
``docs/trtllm_notes.md``); ``tensorrt_llm`` is imported only when a :class:`TrtllmEngine` is created, and a
missing package raises ``ImportError`` naming it. The pure functions here (the ``LLM(...)`` arguments, the
``SamplingParams`` arguments, the environment) are unit-tested without TensorRT-LLM.

What the engine does:

- ``tensorrt_llm.LLM(model, tokenizer, **options)`` with the options of
  :func:`lookahead_reasoning.production.engine_specs.llm_api_options` turned into ``tensorrt_llm.llmapi`` objects
  (``KvCacheConfig`` with block reuse on, ``CudaGraphConfig``, the decoding config of ``spec.drafting``).
  The LLM API does in-flight batching and prefix (KV block) reuse itself, so the ``gamma + 1`` branches of
  a Lookahead Reasoning cycle share their prefix's KV blocks.
- One ``llm.generate_async({"prompt_token_ids": ids}, SamplingParams(...), streaming=...)`` per request,
  awaited side by side. Stop strings are passed to TensorRT-LLM (it matches them on token ids) AND checked on
  the decoded text of the streamed tokens: ``"\\n\\n"`` merged into a larger token (``".\\n\\n"``) is missed
  by token-id matching, so the request is aborted (``RequestOutput.abort()``) as soon as the decoded text
  completes a stop string, and the output is cut after that token (the engine contract).
- Token-level speculative decoding is fixed per engine (``spec.drafting``); ``GenerationRequest.spec`` is
  advisory only (greedy outputs are the same either way).
- The tokenizer, EOS ids and context length come from the served checkpoint folder (Hugging Face format).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from ..production.engine_specs import EngineSpec, llm_api_options
from .base import (
    GenerationCounters,
    GenerationRequest,
    GenerationResult,
    LoopThreadEngine,
    finish_generation,
    first_stop_end,
)
from .tokenizer import TokenizerAccess

#: LLM-API decoding_type -> class names in ``tensorrt_llm.llmapi`` (first one present is used; EAGLE3
#: configs were ``EagleDecodingConfig(eagle3_one_model=...)`` before ``Eagle3DecodingConfig`` existed).
DECODING_CLASSES: dict[str, tuple[str, ...]] = {
    "NGram": ("NGramDecodingConfig",),
    "Eagle3": ("Eagle3DecodingConfig", "EagleDecodingConfig"),
    "Draft_Target": ("DraftTargetDecodingConfig",),
    "Medusa": ("MedusaDecodingConfig",),
}

_MISSING = (
    "runtime 'trtllm' needs the Python package `tensorrt-llm` (TensorRT-LLM >= 1.0, NVIDIA GPU with CUDA; "
    "it ships in the NGC image nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3, or `pip install "
    "tensorrt-llm` from NVIDIA's index on a CUDA host); `import tensorrt_llm` failed: {err}"
)


def import_tensorrt_llm():
    """``(tensorrt_llm, tensorrt_llm.llmapi)``.

    Raises:
        ImportError: naming the package ``tensorrt-llm`` when it is missing or cannot load (no CUDA driver).
    """
    try:
        import tensorrt_llm
        from tensorrt_llm import llmapi
    except (ImportError, OSError) as exc:  # OSError: libcuda.so.1 missing on a machine without a GPU driver
        raise ImportError(_MISSING.format(err=exc)) from exc
    return tensorrt_llm, llmapi


def llm_constructor_args(spec: EngineSpec, model: str, tokenizer: str | None = None) -> dict[str, Any]:
    """Arguments of ``tensorrt_llm.LLM`` for ``spec`` as plain data (nested configs still dicts).

    ``model``: the served checkpoint (the FP8 export for FP8 specs); ``tokenizer``: defaults to ``model``.
    Raises ``ValueError`` for a spec whose runtime is not ``llmapi``.
    """
    args = {"model": str(model), "tokenizer": str(tokenizer or model)}
    args.update(llm_api_options(spec))
    return args


def instantiate_llm_args(args: dict[str, Any], llmapi) -> dict[str, Any]:
    """Turn the nested dicts of :func:`llm_constructor_args` into ``tensorrt_llm.llmapi`` objects
    (``KvCacheConfig``, ``CudaGraphConfig``, the decoding config named by ``decoding_type``).

    Raises:
        ValueError: a ``decoding_type`` this TensorRT-LLM version has no class for.
    """
    out = dict(args)
    out["kv_cache_config"] = llmapi.KvCacheConfig(**args["kv_cache_config"])
    if args.get("cuda_graph_config") is not None:
        out["cuda_graph_config"] = llmapi.CudaGraphConfig(**args["cuda_graph_config"])
    sc = args.get("speculative_config")
    if sc is not None:
        sc = dict(sc)
        kind = sc.pop("decoding_type")
        cls = next((getattr(llmapi, n) for n in DECODING_CLASSES.get(kind, ()) if hasattr(llmapi, n)), None)
        if cls is None:
            raise ValueError(f"drafting.method: this TensorRT-LLM has no decoding config for {kind!r}")
        if cls.__name__ == "EagleDecodingConfig":
            sc.setdefault("eagle3_one_model", True)
        out["speculative_config"] = cls(**sc)
    return out


def sampling_kwargs(req: GenerationRequest, eos_token_ids: frozenset[int], end_id: int | None,
                    pad_id: int | None) -> dict[str, Any]:
    """Keyword arguments of ``tensorrt_llm.SamplingParams`` for one request.

    Greedy: ``top_k=1`` (the LLM API treats ``top_k in (None, 1)`` with ``top_p in (None, 0)`` as greedy,
    ``SamplingParams._greedy_decoding``). Sampled: ``temperature``, ``top_p`` and ``top_k`` (0 = all tokens)
    always explicit, since ``None`` means "runtime default". ``seed`` per request. ``end_id`` is the
    tokenizer's EOS; other EOS ids (generation_config lists several for Qwen) go to ``stop_token_ids``.
    Stop strings are passed with ``include_stop_str_in_output=True`` so the stop token stays in the output.
    """
    s = req.sampling
    kw: dict[str, Any] = {"max_tokens": int(req.max_new_tokens), "end_id": end_id, "pad_id": pad_id,
                          "seed": s.seed}
    extra_eos = sorted(int(e) for e in eos_token_ids if e != end_id)
    if extra_eos:
        kw["stop_token_ids"] = extra_eos
    if req.stop:
        kw["stop"] = list(req.stop)
        kw["include_stop_str_in_output"] = True
    if s.greedy:
        kw["top_k"] = 1
    else:
        kw.update(temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k))
    return kw


def gpu_environment(spec: EngineSpec, replica: int = 0, environ: dict | None = None) -> dict[str, str]:
    """Environment variables that pin this engine to its GPUs: ``CUDA_VISIBLE_DEVICES`` = the replica's ids.

    Empty when ``CUDA_VISIBLE_DEVICES`` is already set (a container or scheduler chose the devices) or when
    ``LOOKAHEAD_PIN_GPUS=0``. Must be applied before CUDA is initialised in the process.
    """
    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES") or env.get("LOOKAHEAD_PIN_GPUS", "1") == "0":
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.replica_gpus(replica))}


class TrtllmEngine(LoopThreadEngine, TokenizerAccess):
    """The Engine interface over ``tensorrt_llm.LLM`` (see module docstring). NOT RUN IN CI.

    Args:
        spec: an engine spec with ``runtime: llmapi``.
        model: checkpoint folder to load (default ``spec.served_checkpoint()``: the FP8 export for FP8 specs).
        tokenizer: tokenizer folder (default: ``spec.tokenizer`` or ``model``).
        replica: which slice of ``spec.gpus`` to pin to (see :func:`gpu_environment`).

    Raises:
        ValueError: the spec is not for runtime ``llmapi``. ImportError: ``tensorrt-llm`` is not installed or
        cannot load (the message names the package).
    """

    name = "trtllm"

    def __init__(self, spec: EngineSpec, model: str | None = None, tokenizer: str | None = None,
                 replica: int = 0) -> None:
        if spec.runtime != "llmapi":
            raise ValueError(f"runtime: the TensorRT-LLM backend serves 'llmapi' specs; {spec.name!r} is "
                             f"{spec.runtime!r} (legacy engines are served by trtllm-serve / Triton of <= 1.2.x)")
        self.spec = spec
        model = model or spec.served_checkpoint()
        tok = tokenizer or spec.tokenizer or model
        pinned = gpu_environment(spec, replica)
        os.environ.update(pinned)  # before tensorrt_llm (and CUDA) load in this process
        try:
            trt, llmapi = import_tensorrt_llm()
        except ImportError:
            for k in pinned:
                os.environ.pop(k, None)
            raise
        self._load_tokenizer(tok)
        self._context = min(self._context, spec.limits.max_seq_len)
        self._end_id = self.tokenizer.eos_token_id
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self._end_id
        args = instantiate_llm_args(llm_constructor_args(spec, model, tok), llmapi)
        self.llm = trt.LLM(**args)
        self._sampling_cls = trt.SamplingParams
        self._start_loop("trtllm")  # blocking callers and any asyncio loop share the LLM's async API

    async def _one(self, req: GenerationRequest) -> GenerationResult:
        t0 = time.perf_counter()
        params = self._sampling_cls(**sampling_kwargs(req, self._eos, self._end_id, self._pad_id))
        streaming = bool(req.stop)
        out = self.llm.generate_async({"prompt_token_ids": list(req.prompt_ids)}, sampling_params=params,
                                      streaming=streaming)
        self._inflight += 1
        ids: list[int] = []
        server_finish = None
        try:
            if streaming:
                async for partial in out:
                    comp = partial.outputs[0]
                    ids, server_finish = list(comp.token_ids), comp.finish_reason
                    eos_end = next((i + 1 for i, t in enumerate(ids) if t in self._eos), len(ids))
                    if first_stop_end(ids[:eos_end], req.stop, self.decode) is not None:
                        if not getattr(out, "finished", False):
                            out.abort()  # the text completed a stop string TensorRT-LLM's id matching missed
                        break
            else:
                final = await out.aresult()
                comp = final.outputs[0]
                ids, server_finish = list(comp.token_ids), comp.finish_reason
        except asyncio.CancelledError:
            out.abort()
            raise
        finally:
            self._inflight -= 1
        ids, finish = finish_generation(ids, max_new_tokens=req.max_new_tokens, stop=req.stop,
                                        eos_token_ids=self._eos, decode=self.decode, server_finish=server_finish)
        counters = GenerationCounters(prefill_tokens_computed=len(req.prompt_ids), seconds=time.perf_counter() - t0)
        return GenerationResult(ids, self.decode(ids), finish, counters)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_loop()
        self.llm.shutdown()


__all__ = ["DECODING_CLASSES", "TrtllmEngine", "gpu_environment", "import_tensorrt_llm", "instantiate_llm_args",
           "llm_constructor_args", "sampling_kwargs"]
