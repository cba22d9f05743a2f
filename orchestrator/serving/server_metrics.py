"""Prometheus metrics of the ``lookahead_reasoning`` Triton model, exported on Triton's metrics port.

One catalogue (:data:`FAMILIES`): Prometheus naming (prefix ``lookahead_``, counters end in ``_total``, times in
``_seconds``), as vLLM names its ``vllm:`` series. Every labelled series exists from start-up at 0 (all modes,
sources, roles, error reasons and depths up to the profile's cap on ``gamma``, ``options.max_gamma``), so a rate
over a fresh server is 0, not missing. Rates come from counters; there is no rate gauge: the acceptance rate per
depth is ``rate(lookahead_accepted_steps_total[5m]) / rate(lookahead_drafted_steps_total[5m])`` (README, "Metrics").

Times (histograms, label ``mode``):
- ``lookahead_time_to_first_token_seconds``: request arrival to the first response carrying text, as the
  client sees it. Steps are the streaming unit, so with ``stream`` this is the time to the first step; without
  ``stream`` the first token arrives with the whole answer (e2e).
- ``lookahead_time_to_first_step_seconds``: arrival to the first decided step (stream or not).
- ``lookahead_step_latency_seconds``: time between consecutive decided steps (the step-level ITL).
- ``lookahead_e2e_request_latency_seconds``: arrival to the final response.
- ``lookahead_queue_time_seconds`` (label ``role``): per request, the time its calls of that role waited to
  enter the role engine's running batch (vLLM's ``request_queue_time_seconds``, summed over the request's calls).
  The time a request waits before this model starts it is Triton's own ``nv_inference_queue_duration_us``.

Prefix cache (label ``role``), in prompt tokens as vLLM counts them: ``lookahead_prefix_cache_queries_total``
(looked up) and ``lookahead_prefix_cache_hits_total`` (served from the cache); the hit rate is
``rate(..._hits_total[5m]) / rate(..._queries_total[5m])``.

Source: Triton Python backend custom metrics (``pb_utils.MetricFamily`` with ``COUNTER`` / ``GAUGE`` /
``HISTOGRAM``; ``Metric(labels=..., buckets=...)``, ``increment``, ``set``, ``observe``), python_backend README,
"Custom Metrics"; naming: Prometheus "Metric and label naming".
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Literal, get_args

from ..backends.base import SpecDecodeConfig
from ..core.lookahead import MODES

SOURCES = ("draft", "target")
ROLES = ("target", "draft")
#: ``lookahead_request_errors_total{reason}``: ``bad_request`` (a field the server refused), ``busy``
#: (``max_concurrency`` requests in flight), ``timeout`` (a role model call past its timeout), ``internal``.
ERROR_REASONS = ("bad_request", "busy", "timeout", "internal")
#: Modes whose cycles draft steps (series by depth exist for these).
SPECULATIVE_MODES = tuple(m for m in MODES if m.startswith("lr"))
#: Token-level SD methods inside the target's calls, and the proposal positions created at start-up (a
#: position past these gets its series when first counted).
SD_METHODS = tuple(m for m in get_args(SpecDecodeConfig.model_fields["method"].annotation) if m != "none")
SD_POSITIONS = 8

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_E2E = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
_STEP = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class Family:
    """One metric family: Prometheus ``name``, ``help`` text, kind, label names, histogram ``buckets`` (seconds)."""

    name: str
    help: str
    kind: Literal["counter", "gauge", "histogram"]
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("lookahead_requests_total", "requests completed", "counter", ("mode",)),
    Family("lookahead_request_errors_total", "requests that ended in an error, by reason", "counter", ("reason",)),
    Family("lookahead_requests_cancelled_total", "requests cancelled by the client", "counter", ("mode",)),
    Family("lookahead_requests_in_flight", "requests being served", "gauge"),
    Family("lookahead_prompt_tokens_total", "prompt tokens (target tokenizer)", "counter", ("mode",)),
    Family("lookahead_generation_tokens_total", "generated tokens (target tokenizer)", "counter", ("mode",)),
    Family("lookahead_steps_total", "output steps, by the model that wrote them", "counter", ("mode", "source")),
    Family("lookahead_cycles_total", "speculation cycles", "counter", ("mode",)),
    Family("lookahead_drafted_steps_total", "drafted steps the judge saw, by depth in the cycle (0: first)",
           "counter", ("mode", "depth")),
    Family("lookahead_accepted_steps_total", "drafted steps accepted, by depth in the cycle (0: first)",
           "counter", ("mode", "depth")),
    Family("lookahead_judge_fallbacks_total", "judge calls that failed or timed out (drafts rejected)", "counter",
           ("mode",)),
    Family("lookahead_draft_failures_total", "draft calls that failed (the request went on target-only)",
           "counter", ("mode",)),
    Family("lookahead_prefill_tokens_total", "prompt tokens computed, not served from the prefix cache, by role",
           "counter", ("role",)),
    Family("lookahead_prefill_calls_total", "calls that computed prompt tokens, by role", "counter", ("role",)),
    Family("lookahead_prefix_cache_queries_total", "prompt tokens looked up in the role's prefix cache",
           "counter", ("role",)),
    Family("lookahead_prefix_cache_hits_total", "prompt tokens served from the role's prefix cache", "counter",
           ("role",)),
    Family("lookahead_sd_forwards_total", "the target's decoding forwards (one per row) in requests with "
           "token-level SD, by method; acceptance length = 1 + accepted tokens / forwards", "counter", ("method",)),
    Family("lookahead_sd_drafted_tokens_total", "token-level SD proposals in the target's calls, by method and "
           "position in the forward's proposals (0: first)", "counter", ("method", "position")),
    Family("lookahead_sd_accepted_tokens_total", "token-level SD proposals that reached the output, by method and "
           "position (position i is accepted only if 0..i-1 were)", "counter", ("method", "position")),
    Family("lookahead_queue_time_seconds", "per request, time its calls of the role waited to enter the role "
           "engine's running batch", "histogram", ("role",), _STEP),
    Family("lookahead_time_to_first_token_seconds", "arrival to the first response with text", "histogram",
           ("mode",), _LATENCY),
    Family("lookahead_time_to_first_step_seconds", "arrival to the first decided step", "histogram", ("mode",),
           _LATENCY),
    Family("lookahead_step_latency_seconds", "time between consecutive decided steps", "histogram", ("mode",),
           _STEP),
    Family("lookahead_e2e_request_latency_seconds", "arrival to the final response", "histogram", ("mode",), _E2E),
)}


def label_sets(family: Family, max_depth: int) -> list[dict[str, str]]:
    """Every label combination created at start-up: modes, sources, roles, reasons, depths ``0..max_depth-1``
    (depths for the speculative modes only)."""
    if family.labels == ("mode", "depth"):
        return [{"mode": m, "depth": str(d)} for m, d in product(SPECULATIVE_MODES, range(max_depth))]
    values = {"mode": MODES, "source": SOURCES, "role": ROLES, "reason": ERROR_REASONS, "method": SD_METHODS,
              "position": tuple(str(i) for i in range(SD_POSITIONS))}
    return [dict(zip(family.labels, combo, strict=False)) for combo in product(*(values[k] for k in family.labels))]


class ServerMetrics:
    """The families of :data:`FAMILIES` registered with Triton, every series created at 0.

    Args:
        pb_utils: ``triton_python_backend_utils`` (only importable inside a Triton Python model).
        max_depth: the largest ``gamma`` the server accepts (series by depth ``0..max_depth-1``).
    """

    def __init__(self, pb_utils, max_depth: int) -> None:
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE,
                 "histogram": pb_utils.MetricFamily.HISTOGRAM}
        self._series: dict[tuple, object] = {}
        self._families = {}
        for fam in FAMILIES.values():
            self._families[fam.name] = pb_utils.MetricFamily(fam.name, fam.help, kinds[fam.kind])
            for labels in label_sets(fam, max_depth):
                self._get(fam.name, labels)

    def _get(self, name: str, labels: dict[str, str]):
        key = (name, tuple(sorted(labels.items())))
        if key not in self._series:
            fam = FAMILIES[name]
            kwargs = {"buckets": list(fam.buckets)} if fam.kind == "histogram" else {}
            self._series[key] = self._families[name].Metric(labels=labels, **kwargs)
        return self._series[key]

    def close(self) -> None:
        """Free every series and family now; call it from the model's ``finalize``.

        Freed later, at the stub's exit, a family clears its series through the stub's shared memory, which is
        gone by then: the stub died with SIGSEGV in ``MetricFamily::~MetricFamily`` -> ``Metric::Clear`` ->
        ``Metric::SaveToSharedMemory`` inside ``Stub::~Stub`` (one to four stubs at every shutdown; gdb, Triton 2.51 as
        bundled).
        """
        self._series.clear()
        self._families.clear()

    def add(self, name: str, value: float = 1.0, **labels: str) -> None:
        """Increment counter ``name`` (a value of 0 is skipped: Triton refuses nothing, but it is a no-op)."""
        if value:
            self._get(name, labels).increment(value)

    def set(self, name: str, value: float, **labels: str) -> None:
        self._get(name, labels).set(value)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        self._get(name, labels).observe(seconds)

    def record_request(self, mode: str, m) -> None:
        """Count a finished request's :class:`~lookahead_reasoning.core.metrics.RequestMetrics` ``m``."""
        self.add("lookahead_requests_total", 1, mode=mode)
        self.add("lookahead_prompt_tokens_total", m.prompt_tokens, mode=mode)
        self.add("lookahead_generation_tokens_total", m.generated_tokens, mode=mode)
        self.add("lookahead_steps_total", m.steps - m.target_steps, mode=mode, source="draft")
        self.add("lookahead_steps_total", m.target_steps, mode=mode, source="target")
        self.add("lookahead_cycles_total", m.cycles, mode=mode)
        for depth, n in enumerate(m.verified_by_depth):
            self.add("lookahead_drafted_steps_total", n, mode=mode, depth=str(depth))
        for depth, n in enumerate(m.accepted_by_depth):
            self.add("lookahead_accepted_steps_total", n, mode=mode, depth=str(depth))
        self.add("lookahead_judge_fallbacks_total", m.fallbacks, mode=mode)
        self.add("lookahead_draft_failures_total", m.draft_failures, mode=mode)
        if m.sd_method != "none":
            t = m.target
            self.add("lookahead_sd_forwards_total", t.forward_passes, method=m.sd_method)
            for pos, n in enumerate(t.proposed_by_position):
                self.add("lookahead_sd_drafted_tokens_total", n, method=m.sd_method, position=str(pos))
            for pos, n in enumerate(t.accepted_by_position):
                self.add("lookahead_sd_accepted_tokens_total", n, method=m.sd_method, position=str(pos))
        for role in ROLES:
            counts = getattr(m, role)
            self.add("lookahead_prefill_tokens_total", counts.prefill_tokens, role=role)
            self.add("lookahead_prefill_calls_total", counts.prefill_calls, role=role)
            self.add("lookahead_prefix_cache_queries_total", counts.lookup_tokens, role=role)
            self.add("lookahead_prefix_cache_hits_total", counts.cached_tokens, role=role)
            if counts.calls:
                self.observe("lookahead_queue_time_seconds", counts.queue_seconds, role=role)


def error_reason(exc: BaseException) -> str:
    """The ``reason`` label of a request that ended with ``exc``."""
    if isinstance(exc, ValueError):
        return "bad_request"
    cause: BaseException | None = exc
    while cause is not None:  # the loop wraps a role model's timeout ("target model failed: TimeoutError")
        if isinstance(cause, TimeoutError):
            return "timeout"
        cause = cause.__cause__
    return "internal"
