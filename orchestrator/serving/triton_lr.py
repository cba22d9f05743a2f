"""Library side of the ``lookahead_reasoning`` Triton model: the streaming BLS orchestrator.

A decoupled Python-backend model with ``async def execute``: for each request it runs the Lookahead
Reasoning loop (:class:`~lookahead_reasoning.core.lookahead.LookaheadReasoner`) over the ``draft``, ``target`` and
``judge`` role models called through BLS (:class:`~lookahead_reasoning.backends.triton_bls.TritonBLSEngine`),
sends one response per decided step when ``stream`` is true (``text_output`` = the step, ``metrics`` = JSON
``{"step_tokens", "source", "depth"}``), and ends with a response holding the request's metrics as JSON and a
``text_output`` that is usually empty (with ``stream`` false: one response with the whole text and the metrics).
The matched stop string is left out of ``text_output`` unless ``include_stop_str_in_output`` (as OpenAI and vLLM):
while streaming, a step's tail that may be the start of a stop string is held back and sent with the next step or
in the final response. Requests run side by side.

Limits (model parameters): ``max_tokens_limit`` (largest ``max_tokens`` accepted), ``max_prompt_bytes``,
``max_concurrency`` (requests in flight in this instance; more are refused), ``bls_threads`` (worker threads
for BLS calls to the role models, so the most role-model calls in flight at once), ``call_timeout_s`` (per BLS
call, enforced by Triton), ``judge_timeout_s`` / ``draft_timeout_s`` / ``target_timeout_s`` (per call of that
role, enforced by the loop: a slow judge rejects the drafts, a slow draft turns the request target-only, a slow
target is an error). Prometheus metrics (Triton's metrics port): :mod:`.server_metrics`.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..core.request import FIELDS, TRITON_INPUTS, Limits, RequestError, front_error, parse_request
from .server_metrics import ServerMetrics, error_reason
from .triton_role import load_model_profile, model_parameters

# Request parameters Triton itself defines (inference protocol); any other parameter is a misspelt input.
_TRITON_PARAMETERS = {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output",
                      "headers"}


def decode_inputs(get) -> dict:
    """The request's values from the model's input tensors (canonical names,
    :data:`~lookahead_reasoning.core.request.FIELDS`).

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


def _ok_line(result, mode: str, stream: bool, e2e: float) -> str:
    """The access-log line of an answered request (its finish, token counts, acceptance and latencies in s)."""
    m = result.metrics
    acc = "-" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}"
    return (f"status=ok mode={mode} stream={str(stream).lower()} finish={result.finish_reason} "
            f"prompt_tokens={m.prompt_tokens} generated_tokens={m.generated_tokens} steps={m.steps} "
            f"cycles={m.cycles} acceptance={acc} ttft_s={(m.ttft_seconds or 0):.3f} e2e_s={e2e:.3f}")


class LookaheadReasoningModel:
    """``TritonPythonModel`` of the ``lookahead_reasoning`` model (import it as that name in ``model.py``)."""

    def initialize(self, args: dict) -> None:
        import faulthandler

        import triton_python_backend_utils as pb_utils

        # A stub that dies of a native fault (SIGSEGV, SIGABRT, ...) leaves every thread's Python stack in the
        # server log (the stub's stderr) instead of vanishing silently.
        faulthandler.enable()

        from ..backends.triton_bls import TritonBLSEngine
        from ..core.lookahead import LookaheadReasoner
        from ..profiles import IN_PROCESS_RUNTIMES

        self.pb = pb_utils
        params = model_parameters(args)
        self.profile = load_model_profile(params)
        timeout = float(params.get("call_timeout_s") or 0) or None
        p = self.profile
        self.pool = ThreadPoolExecutor(int(params.get("bls_threads") or 64), thread_name_prefix="lr-bls")
        target = TritonBLSEngine("target", str(p.target.tokenizer_path()), timeout, self.pool)
        # the draft's chain of a cycle in one call where the role model's engine can stop at the k-th delimiter
        draft = TritonBLSEngine("draft", str(p.draft.tokenizer_path()), timeout, self.pool,
                                supports_stop_count=p.draft.runtime in IN_PROCESS_RUNTIMES) if p.draft else None
        judge = TritonBLSEngine("judge", str(p.judge.tokenizer_path()), timeout, self.pool) if p.judge else None
        timeouts = {k: float(params[k]) for k in ("judge_timeout_s", "draft_timeout_s", "target_timeout_s")
                    if float(params.get(k) or 0) > 0}
        defaults = p.options.model_copy(update=timeouts) if timeouts else p.options
        self.profile = p.model_copy(update={"options": defaults})
        self.reasoner = LookaheadReasoner(target, draft, judge, defaults=defaults, judges=p.served_judges(),
                                          sd_methods=p.target_sd_methods())
        self.limits = Limits(max_tokens=int(params.get("max_tokens_limit") or 4096),
                             max_prompt_bytes=int(params.get("max_prompt_bytes") or 65536))
        self.max_concurrency = int(params.get("max_concurrency") or 256)
        self.active = 0
        self.metrics = ServerMetrics(pb_utils, p.options.max_gamma)

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
        """Answer one request through its response sender: refused when ``max_concurrency`` requests are in
        flight, else parsed, run and answered; any error becomes an error response (never raised)."""
        t0 = time.perf_counter()
        sender = request.get_response_sender()
        if self.active >= self.max_concurrency:
            self._refuse_busy(sender)
            return
        self.active += 1
        self.metrics.set("lookahead_requests_in_flight", self.active)
        try:
            req, opts = self._parse(request)
            trim = req.trimmer(opts)
            cancelled, result = await self._run(request, sender, req, opts, trim, t0)
            if not cancelled:
                self._send_final(sender, result, req.stream, opts.mode, trim, t0)
        except Exception as exc:  # noqa: BLE001 - a bad request gets an error response; the server stays up
            self._send_error(sender, exc, t0)
        finally:
            self.active -= 1
            self.metrics.set("lookahead_requests_in_flight", self.active)

    def _refuse_busy(self, sender) -> None:
        """The final response of a request refused because ``max_concurrency`` requests are in flight
        (``UNAVAILABLE``), counted and logged."""
        pb = self.pb
        self.metrics.add("lookahead_request_errors_total", reason="busy")
        self._access(f"status=error reason=busy in_flight={self.active}")
        sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(
            f"server busy: {self.active} requests in flight (max_concurrency {self.max_concurrency})",
            pb.TritonError.UNAVAILABLE)), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _parse(self, request):
        """The request and its options from the input tensors (:func:`parse_request`, this model's limits).

        Raises:
            ValueError: a request parameter that is not Triton's (HTTP generate turns JSON fields that are not
                inputs into parameters: a misspelt input), or any input :func:`parse_request` refuses.
        """
        def get(name):
            t = self.pb.get_input_tensor_by_name(request, name)
            return None if t is None else t.as_numpy()

        unknown = sorted(set(json.loads(request.parameters() or "{}")) - _TRITON_PARAMETERS)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown input (inputs: {', '.join(TRITON_INPUTS)})")
        return parse_request(decode_inputs(get), self.profile.options, self.limits)

    async def _run(self, request, sender, req, opts, trim, t0: float):
        """Run the reasoning loop of a parsed request, sending each decided step when streaming (its tail held
        back by ``trim``) and observing the step latencies; ``t0`` is the request's start (``perf_counter``).

        Returns:
            ``(cancelled, result)``: ``(True, None)`` where the client cancelled (the final empty response is
            sent), else ``(False, LRResult)`` (None if the loop ended without one).
        """
        from ..core.lookahead import LRResult

        mode, stream = opts.mode, req.stream
        gen = self.reasoner.stream(req.prompt, req.chat(), opts, checked=True)  # parse_request checked it
        result, last_step = None, None
        try:
            async for event in gen:
                if request.is_cancelled():
                    self.metrics.add("lookahead_requests_cancelled_total", mode=mode)
                    self._access(f"status=cancelled mode={mode} e2e_s={time.perf_counter() - t0:.3f}")
                    sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return True, None
                if isinstance(event, LRResult):
                    result = event
                    continue
                last_step = self._observe_step(mode, stream, t0, last_step)
                if stream:
                    info = {"step_tokens": event.token_count, "source": event.source, "depth": event.depth}
                    sender.send(self._response(trim.feed(event.text), json.dumps(info)))
        finally:
            await gen.aclose()
        return False, result

    def _observe_step(self, mode: str, stream: bool, t0: float, last_step: float | None) -> float:
        """Observe a decided step's latency (the first: time to first step, and to first token when streaming;
        then: since the previous step, ``last_step``); returns now (``perf_counter`` seconds)."""
        now = time.perf_counter()
        if last_step is None:
            self.metrics.observe("lookahead_time_to_first_step_seconds", now - t0, mode=mode)
            if stream:
                self.metrics.observe("lookahead_time_to_first_token_seconds", now - t0, mode=mode)
        else:
            self.metrics.observe("lookahead_step_latency_seconds", now - last_step, mode=mode)
        return now

    def _send_final(self, sender, result, stream: bool, mode: str, trim, t0: float) -> None:
        """The final response: the whole text (not streaming) or what the stop trimmer held back (may be "")
        with the request's metrics as JSON; the request's metrics and access line are recorded first."""
        out = result.metrics.to_dict()
        out["finish_reason"] = result.finish_reason
        self.metrics.record_request(mode, result.metrics)
        rest = trim.apply("" if stream else result.text, result.finish_reason == "stop")
        # latency and the access line are recorded before the final response leaves: a client that scrapes
        # /metrics or reads the log right after its answer must find its own request there
        e2e = time.perf_counter() - t0
        if not stream:
            self.metrics.observe("lookahead_time_to_first_token_seconds", e2e, mode=mode)
        self.metrics.observe("lookahead_e2e_request_latency_seconds", e2e, mode=mode)
        self._access(_ok_line(result, mode, stream, e2e))
        sender.send(self._response(rest, json.dumps(out)), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _send_error(self, sender, exc: Exception, t0: float) -> None:
        """The final error response of a failed request, counted and logged: a bad request (``ValueError``) is
        ``INVALID_ARG`` (HTTP 400) naming the field as Triton does; anything else ``INTERNAL`` (500)."""
        pb = self.pb
        reason = error_reason(exc)
        self.metrics.add("lookahead_request_errors_total", reason=reason)
        self._access(f"status=error reason={reason} e2e_s={time.perf_counter() - t0:.3f} "
                     f"message={json.dumps(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)}")
        bad = isinstance(exc, ValueError)
        msg = front_error(exc, "triton") if bad else f"{type(exc).__name__}: {exc}"
        code = pb.TritonError.INVALID_ARG if bad else pb.TritonError.INTERNAL
        sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(msg, code)),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _access(self, line: str) -> None:
        """One access-log line per request, in Triton's log at INFO (``pb_utils.Logger``)."""
        self.pb.Logger.log_info(f"lookahead_reasoning request: {line}")

    def finalize(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.metrics.close()  # while the stub's shared memory is still there (ServerMetrics.close says why)
        from ..backends.triton_bls import release_held

        release_held()  # the same for the BLS responses still held (triton_bls.DeferredRelease)
