"""Library side of the Triton role models (``draft``, ``target``, ``judge``).

Each role model is a decoupled Python-backend model with ``async def execute``, hosting ONE engine built from
the profile's :class:`~lookahead_reasoning.profiles.ModelSpec` for its role (portable PyTorch/transformers or
TensorRT-LLM). Concurrent requests are awaited side by side, so the engine's scheduler batches them in flight.
A cancelled request cancels its engine work. Tensors: :mod:`lookahead_reasoning.backends.role_tensors`.
"""

from __future__ import annotations

import asyncio
import json

from ..backends.role_tensors import (
    ROLE_MAX_NEW_TOKENS,
    ROLE_MAX_ROWS,
    arrays_to_requests,
    check_role_call,
    is_internal,
    results_to_arrays,
)


def model_parameters(args: dict) -> dict[str, str]:
    """The ``parameters`` of a model's config.pbtxt as a plain dict of strings."""
    cfg = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}


def utf8_locale() -> str:
    """Set the stub process's ``LC_CTYPE`` to a UTF-8 locale where it is not one; returns the encoding in effect.

    Triton's Python-backend stub embeds the interpreter with pybind11, which initialises it isolated (``PyConfig``
    "isolated configuration", Python docs "Python Initialization Configuration"): neither the environment's
    ``LANG`` nor ``PYTHONUTF8`` applies, and the C locale leaves ``open()`` decoding as ASCII. torch.compile (a
    profile's ``compile: true``) then fails at start-up reading its UTF-8 kernel templates without an encoding
    (pytorch/pytorch#189342). The stub hosts one role model, so the process-wide setting touches nothing else.

    Raises:
        RuntimeError: no UTF-8 locale is installed (``C.UTF-8``, ``C.utf8``, ``en_US.UTF-8`` tried).
    """
    import codecs
    import locale

    for name in (None, "C.UTF-8", "C.utf8", "en_US.UTF-8"):  # None: the locale in effect
        try:
            if name:
                locale.setlocale(locale.LC_CTYPE, name)
        except locale.Error:
            continue
        encoding = locale.getpreferredencoding(False)
        if codecs.lookup(encoding).name == "utf-8":
            return encoding
    raise RuntimeError("the Python backend stub runs in an ASCII locale and no UTF-8 locale (C.UTF-8) is installed")


def load_model_profile(params: dict[str, str]):
    from ..profiles import load_profile

    return load_profile(params.get("profile") or None, params.get("profile_config") or None)


def engine_dtype(engine) -> str:
    """The dtype an engine computes in (``dtype: auto`` resolved; llama.cpp: the GGUF's weight type, e.g. ``Q4_1``), or
    ``unknown`` for backends that do not say."""
    choice = getattr(engine, "dtype_choice", None)
    if choice is not None:
        return choice.dtype
    dtype = getattr(engine, "dtype", None)
    return dtype if isinstance(dtype, str) else "unknown"


class RoleModel:
    """``TritonPythonModel`` for a role model (import it as that name in ``model.py``)."""

    def initialize(self, args: dict) -> None:
        import faulthandler

        import triton_python_backend_utils as pb_utils

        # A stub that dies of a native fault (SIGSEGV, SIGABRT, ...) leaves every thread's Python stack in the
        # server log (the stub's stderr) instead of vanishing silently.
        faulthandler.enable()
        utf8_locale()

        from ..backends import make_engine
        from ..profiles import IN_PROCESS_RUNTIMES

        self.pb = pb_utils
        params = model_parameters(args)
        self.role = params.get("role") or args["model_name"]
        profile = load_model_profile(params)
        spec = getattr(profile, self.role, None)
        if spec is None:
            raise ValueError(f"role: profile {profile.name!r} has no {self.role!r} model")
        threads = params.get("num_threads")
        if threads:
            spec = spec.model_copy(update={"num_threads": int(threads)})
        # A portable target serves draft-model SD (the demo's default target_spec) with the profile's draft in its
        # own process, as the in-process reasoner does (profiles.build_reasoner) and TensorRT-LLM's Draft_Target
        # decoding runs the draft inside the target's executor.
        self.draft_engine = None
        if (self.role == "target" and spec.runtime in IN_PROCESS_RUNTIMES
                and getattr(profile.draft, "runtime", None) in IN_PROCESS_RUNTIMES):
            self.draft_engine = make_engine(profile.draft)
        self.engine = make_engine(spec, draft_engine=self.draft_engine)
        self.max_rows = int(params.get("max_rows_per_call") or ROLE_MAX_ROWS)
        self.max_new_tokens = int(params.get("max_tokens_limit") or ROLE_MAX_NEW_TOKENS)
        labels = {"role": self.role}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        # Keep the families referenced: the Python backend unregisters a family when its object is freed.
        self._families = [
            pb_utils.MetricFamily("lookahead_engine_active_sequences",
                                  "sequences queued or running in the role's engine", gauge),
            pb_utils.MetricFamily("lookahead_engine_prefix_cache_bytes",
                                  "bytes held by the role's prefix KV cache", gauge),
            pb_utils.MetricFamily("lookahead_engine_cancelled_total",
                                  "engine calls cancelled by their caller", counter),
            pb_utils.MetricFamily("lookahead_engine_dtype_info",
                                  "1, labelled with the dtype the role's engine runs in", gauge),
        ]
        self._active, self._cache_bytes, self._cancelled = (f.Metric(labels=labels) for f in self._families[:3])
        self._families[3].Metric(labels={**labels, "dtype": engine_dtype(self.engine)}).set(1)

    def _observe(self) -> None:
        active, cache_bytes = self._active, self._cache_bytes  # (None once finalize has freed them)
        if active is None or cache_bytes is None:
            return
        active.set(getattr(self.engine, "active_sequences", 0))
        cache = getattr(self.engine, "prefix_cache", None)
        cache_bytes.set(cache.nbytes if cache is not None else 0)

    async def execute(self, requests):
        if getattr(self, "_ticker", None) is None:  # refresh the engine gauges while requests run
            self._ticker = asyncio.ensure_future(self._tick())
        await asyncio.gather(*(self._one(r) for r in requests))
        self._observe()
        return None

    async def _tick(self) -> None:
        while True:
            self._observe()
            await asyncio.sleep(0.25)

    async def _one(self, request) -> None:
        pb = self.pb
        sender = request.get_response_sender()
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if not is_internal(request.parameters()):
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(
                f"{self.role}: internal model of the lookahead_reasoning model; send requests to lookahead_reasoning "
                "(serve --open-role-models opens the role models)", pb.TritonError.UNAVAILABLE)), flags=final)
            return
        try:
            def get(name):
                t = pb.get_input_tensor_by_name(request, name)
                return None if t is None else t.as_numpy()

            reqs = arrays_to_requests(get, self.engine.encode)
            check_role_call(reqs, self.max_rows, self.max_new_tokens)
            task = asyncio.ensure_future(self.engine.agenerate(reqs))
            while not task.done():
                await asyncio.wait({task}, timeout=0.05)
                if not task.done() and request.is_cancelled():
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    sender.send(flags=final)  # first: the caller must never wait on a lost final response
                    self._cancelled.increment(1)
                    return
            results = task.result()
            tensors = [pb.Tensor(name, arr) for name, arr in results_to_arrays(results).items()]
            sender.send(pb.InferenceResponse(output_tensors=tensors), flags=final)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error response; the model stays up
            from ..core.errors import one_line

            bad = isinstance(exc, ValueError)
            msg = one_line(exc) if bad else f"{type(exc).__name__}: {exc}"
            code = pb.TritonError.INVALID_ARG if bad else pb.TritonError.INTERNAL
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(msg, code)), flags=final)

    def finalize(self) -> None:
        # the metric families go first, while the stub's shared memory is still there: freed at the stub's exit they
        # crash it (ServerMetrics.close says why)
        self._families = []
        self._active = self._cache_bytes = self._cancelled = None
        self.engine.close()
        if self.draft_engine is not None:
            self.draft_engine.close()
