"""Engine backends behind one interface (:class:`~.base.Engine`).

Each backend lives in its own module and imports its heavy dependency lazily; :func:`make_engine` builds one
from a :class:`~lookahead_reasoning.profiles.ModelSpec`.
"""

from __future__ import annotations

from pathlib import Path

from .base import Engine, GenerationCounters, GenerationRequest, GenerationResult, SamplingParams, SpecDecodeConfig

__all__ = [
    "Engine", "GenerationCounters", "GenerationRequest", "GenerationResult", "SamplingParams",
    "SpecDecodeConfig", "make_engine",
]


def make_engine(spec, draft_engine=None) -> Engine:
    """Build the engine a :class:`~lookahead_reasoning.profiles.ModelSpec` describes.

    Raises:
        ValueError: unknown runtime or missing settings; ImportError naming the missing package.
    """
    if spec.runtime == "portable":
        from .portable import PortableEngine, PortableEngineConfig

        cfg = PortableEngineConfig(
            model=str(spec.resolved_path()), dtype=spec.dtype, device=spec.device, num_threads=spec.num_threads,
            max_batch_size=spec.max_batch_size, prefix_cache_mb=spec.prefix_cache_mb, compile=spec.compile,
            static_cache=spec.static_cache, cuda_graphs=spec.cuda_graphs, graph_batch_sizes=spec.graph_batch_sizes,
            graph_widths=spec.graph_widths,
            medusa_heads=str(spec.resolved_medusa()) if spec.medusa else None,
            eagle3_head=str(spec.resolved_eagle3()) if spec.eagle3 else None,
        )
        return PortableEngine(cfg, draft_engine=draft_engine)
    if spec.runtime == "llamacpp":  # a GGUF through llama.cpp; the tokenizer from `tokenizer` or the dequantised GGUF
        from .llamacpp import LlamaCppEngine, LlamaCppEngineConfig

        cfg = LlamaCppEngineConfig(model=str(spec.located_path()), tokenizer=str(spec.tokenizer_path()),
                                   n_threads=spec.num_threads or 2, max_batch_size=spec.max_batch_size,
                                   n_gpu_layers=spec.n_gpu_layers)
        return LlamaCppEngine(cfg, draft_engine=draft_engine)
    if spec.runtime == "trtllm":  # TensorRT-LLM LLM API; settings from an engine spec (engines/*.yaml)
        from ..production.engine_specs import ENGINES_DIR, load_spec
        from .trtllm import TrtllmEngine

        if not spec.spec:
            raise ValueError("spec: runtime 'trtllm' needs `spec`, an engine spec YAML (engines/*.yaml)")
        path = Path(spec.spec) if Path(spec.spec).is_absolute() else ENGINES_DIR / spec.spec
        return TrtllmEngine(load_spec(path), model=str(spec.resolved_path()))
    if spec.runtime == "openai":  # any OpenAI-compatible completions server; tokenizer from `path`
        from .openai_http import OpenAIEngine, OpenAIEngineConfig

        if not spec.url:
            raise ValueError("url: runtime 'openai' needs `url`, the server root (e.g. http://127.0.0.1:8001)")
        return OpenAIEngine(OpenAIEngineConfig(url=spec.url, tokenizer=str(spec.tokenizer_path()),
                                               model=spec.served_model, flavor=spec.server_flavor))
    raise ValueError(f"runtime: unknown or unavailable runtime {spec.runtime!r}")
