"""Library side of the ``lookahead_reasoning`` Triton model: the streaming BLS orchestrator.

A decoupled Python-backend model with ``async def execute``: for each request it runs the Lookahead
Reasoning loop (:class:`~lookahead_reasoning.lookahead.LookaheadReasoner`) over the ``draft``, ``target`` and
``judge`` role models called through BLS (:class:`~lookahead_reasoning.backends.triton_bls.TritonBLSEngine`),
sends one response per decided step when ``stream`` is true (``text_output`` = the step, ``metrics`` = JSON
``{"step_tokens", "source", "depth"}``), and ends with a response holding an empty ``text_output`` and the
request's metrics as JSON (with ``stream`` false: one response with the whole text and the metrics). Requests run side by side.

Limits (model parameters): ``max_tokens_limit`` (largest ``max_tokens`` accepted), ``max_prompt_bytes``,
``max_concurrency`` (requests in flight in this instance; more are refused), ``bls_threads`` (worker threads
for BLS calls to the role models, so the most role-model calls in flight at once), ``call_timeout_s`` (per BLS
call, enforced by Triton), ``judge_timeout_s`` / ``draft_timeout_s`` / ``target_timeout_s`` (per call of that
role, enforced by the loop: a slow judge rejects the drafts, a slow draft turns the request target-only, a slow
target is an error). Custom metrics (``pb_utils.MetricFamily``, Triton's metrics port): ``lr_requests_total``,
``lr_steps_total{source}``, ``lr_cycles_total``, ``lr_verified_steps_total``, ``lr_accepted_steps_total``,
``lr_judge_fallbacks_total``, ``lr_draft_failures_total``, ``lr_acceptance_rate`` (cumulative, per mode),
``lr_requests_cancelled_total``, ``lr_requests_in_flight``.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..request import FIELDS, TRITON_INPUTS, Limits, RequestError, front_error, parse_request
from .triton_role import load_model_profile, model_parameters

# Request parameters Triton itself defines (inference protocol); any other parameter is a misspelt input.
_TRITON_PARAMETERS = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output",
                      "headers"}


def decode_inputs(get) -> dict:
    """The request's values from the model's input tensors (canonical names, :data:`~lookahead_reasoning.request.FIELDS`).

    Args:
        get: ``Triton input name -> numpy array or None``.

    Returns:
        ``{field name: value}`` for the inputs present: strings decoded from UTF-8, one value per ``[ 1 ]``
        input, a list per ``[ -1 ]`` input; ``seed`` -1 (none, the role models' convention) left out.

    Raises:
        RequestError: a shape other than one value, bytes that are not UTF-8, a fractional integer, a seed
        below -1 (canonical names: the caller names them as Triton inputs).
    """
    values: dict = {}
    for f in FIELDS:
        arr = get(f.triton)
        if arr is None:
            continue
        flat = arr.reshape(-1)
        if not f.many and flat.shape[0] != 1:
            raise RequestError(f.name, f"expected one value, got shape {list(arr.shape)}")
        items = [_value(f, x) for x in flat]
        values[f.name] = items if f.many else items[0]
    if values.get("seed") is not None and values["seed"] < 0:
        if values["seed"] != -1:
            raise RequestError("seed", f"must be >= 0 (or -1 for none), got {values['seed']}")
        del values["seed"]
    return values


def _value(f, x):
    if f.dtype == "STRING":
        if isinstance(x, (bytes, bytearray, np.bytes_)):
            try:
                return bytes(x).decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f.name, "not valid UTF-8") from None
        return str(x)
    if f.dtype == "BOOL":
        return bool(x)
    if f.dtype == "FP32":
        return float(x)
    if isinstance(x, (float, np.floating)) and not float(x).is_integer():
        raise RequestError(f.name, f"must be an integer, got {x}")
    return int(x)


class LookaheadReasoningModel:
    """``TritonPythonModel`` of the ``lookahead_reasoning`` model (import it as that name in ``model.py``)."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils

        from ..backends.triton_bls import TritonBLSEngine
        from ..lookahead import LookaheadReasoner

        self.pb = pb_utils
        params = model_parameters(args)
        self.profile = load_model_profile(params)
        timeout = float(params.get("call_timeout_s") or 0) or None
        p = self.profile
        self.pool = ThreadPoolExecutor(int(params.get("bls_threads") or 64), thread_name_prefix="lr-bls")
        target = TritonBLSEngine("target", str(p.target.resolved_path()), timeout, self.pool)
        # the draft's chain of a cycle in one call where the role model's engine can stop at the k-th delimiter
        draft = TritonBLSEngine("draft", str(p.draft.resolved_path()), timeout, self.pool,
                                supports_stop_count=p.draft.runtime == "portable") if p.draft else None
        judge = TritonBLSEngine("judge", str(p.judge.resolved_path()), timeout, self.pool) if p.judge else None
        timeouts = {k: float(params[k]) for k in ("judge_timeout_s", "draft_timeout_s", "target_timeout_s")
                    if float(params.get(k) or 0) > 0}
        defaults = p.options.model_copy(update=timeouts) if timeouts else p.options
        self.profile = p.model_copy(update={"options": defaults})
        self.reasoner = LookaheadReasoner(target, draft, judge, defaults=defaults)
        self.limits = Limits(max_tokens=int(params.get("max_tokens_limit") or 4096),
                             max_prompt_bytes=int(params.get("max_prompt_bytes") or 65536),
                             max_gamma=p.max_gamma_cap)
        self.max_concurrency = int(params.get("max_concurrency") or 256)
        self.active = 0
        self._metrics()

    def _metrics(self) -> None:
        pb = self.pb
        counter, gauge = pb.MetricFamily.COUNTER, pb.MetricFamily.GAUGE
        fam = {
            "requests": pb.MetricFamily("lr_requests_total", "Lookahead Reasoning requests completed", counter),
            "steps": pb.MetricFamily("lr_steps_total", "output steps by the model that wrote them", counter),
            "cycles": pb.MetricFamily("lr_cycles_total", "speculation cycles", counter),
            "verified": pb.MetricFamily("lr_verified_steps_total", "drafted steps the judge saw", counter),
            "accepted": pb.MetricFamily("lr_accepted_steps_total", "drafted steps accepted", counter),
            "fallbacks": pb.MetricFamily("lr_judge_fallbacks_total", "judge failures or timeouts", counter),
            "draft_failures": pb.MetricFamily("lr_draft_failures_total", "draft failures (target-only)", counter),
            "acceptance": pb.MetricFamily("lr_acceptance_rate", "cumulative step acceptance rate", gauge),
            "cancelled": pb.MetricFamily("lr_requests_cancelled_total", "requests cancelled by the client", counter),
            "in_flight": pb.MetricFamily("lr_requests_in_flight", "requests being served", gauge),
        }
        self._fam = fam
        self._metric_cache: dict[tuple, object] = {}
        self._totals: dict[str, list[int]] = {}

    def _metric(self, key: str, **labels):
        k = (key, tuple(sorted(labels.items())))
        if k not in self._metric_cache:
            self._metric_cache[k] = self._fam[key].Metric(labels=labels)
        return self._metric_cache[k]

    def _record(self, mode: str, m) -> None:
        self._metric("requests", mode=mode).increment(1)
        self._metric("steps", mode=mode, source="draft").increment(m.steps - m.target_steps)
        self._metric("steps", mode=mode, source="target").increment(m.target_steps)
        self._metric("cycles", mode=mode).increment(m.cycles)
        self._metric("verified", mode=mode).increment(m.verified_steps)
        self._metric("accepted", mode=mode).increment(m.accepted_steps)
        self._metric("fallbacks", mode=mode).increment(m.fallbacks)
        self._metric("draft_failures", mode=mode).increment(m.draft_failures)
        tot = self._totals.setdefault(mode, [0, 0])
        tot[0] += m.accepted_steps
        tot[1] += m.verified_steps
        if tot[1]:
            self._metric("acceptance", mode=mode).set(tot[0] / tot[1])

    async def execute(self, requests):
        # Requests run side by side; their BLS calls run in ``self.pool`` (TritonBLSEngine says why not
        # ``async_exec``).
        await asyncio.gather(*(self._one(r) for r in requests))
        return None

    def _response(self, text: str, metrics: str):
        pb = self.pb
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb.Tensor("metrics", np.array([metrics.encode("utf-8")], dtype=np.object_)),
        ])

    async def _one(self, request) -> None:
        from ..lookahead import LRResult

        pb = self.pb
        sender = request.get_response_sender()
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if self.active >= self.max_concurrency:
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(
                f"server busy: {self.active} requests in flight (max_concurrency {self.max_concurrency})")),
                flags=final)
            return
        self.active += 1
        self._metric("in_flight").set(self.active)
        try:
            def get(name):
                t = pb.get_input_tensor_by_name(request, name)
                return None if t is None else t.as_numpy()

            # HTTP generate turns JSON fields that are not inputs into request parameters: reject them by name
            unknown = sorted(set(json.loads(request.parameters() or "{}")) - _TRITON_PARAMETERS)
            if unknown:
                raise ValueError(f"{unknown[0]}: unknown input (inputs: {', '.join(TRITON_INPUTS)})")
            req, opts = parse_request(decode_inputs(get), self.profile.options, self.limits)
            stream = req.stream
            gen = self.reasoner.stream(req.prompt, req.chat(), opts)
            result = None
            try:
                async for event in gen:
                    if request.is_cancelled():
                        self._metric("cancelled", mode=opts.mode).increment(1)
                        sender.send(flags=final)
                        return
                    if isinstance(event, LRResult):
                        result = event
                    elif stream:
                        info = {"step_tokens": event.token_count, "source": event.source, "depth": event.depth}
                        sender.send(self._response(event.text, json.dumps(info)))
            finally:
                await gen.aclose()
            metrics = result.metrics.to_dict()
            metrics["finish_reason"] = result.finish_reason
            self._record(opts.mode, result.metrics)
            sender.send(self._response("" if stream else result.text, json.dumps(metrics)), flags=final)
        except Exception as exc:  # noqa: BLE001 - a bad request gets an error response; the server stays up
            msg = front_error(exc, "triton") if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(msg)), flags=final)
        finally:
            self.active -= 1
            self._metric("in_flight").set(self.active)

    def finalize(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
