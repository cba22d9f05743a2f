"""Engine backends behind one interface (:class:`~.base.Engine`).

Each backend lives in its own module and imports its heavy dependency lazily; :func:`make_engine` builds one
from a :class:`~lookahead_reasoning.profiles.ModelSpec`.
"""

from __future__ import annotations

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
            max_batch_size=spec.max_batch_size, prefix_cache_mb=spec.prefix_cache_mb,
        )
        return PortableEngine(cfg, draft_engine=draft_engine)
    raise ValueError(f"runtime: unknown or unavailable runtime {spec.runtime!r}")
