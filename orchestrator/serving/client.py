"""Clients of the ``lookahead_reasoning`` Triton model, over gRPC streaming or Triton's HTTP generate extension.

``TritonLRClient.stream(...)`` yields :class:`StepChunk` objects as steps arrive (the last one carries the
request's metrics); ``generate(...)`` returns the whole answer. Request parameters are the model's inputs
(:data:`lookahead_reasoning.core.request.FIELDS`, Triton names): ``max_tokens``, ``temperature``, ``top_p``,
``top_k``, ``seed``, ``stop``, ``mode``, ``gamma``, ``judge``, ``async``, ``adaptive_gamma``, ``width``,
``delimiter``, ``max_step_tokens``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from ..core.request import FIELDS

MODEL = "lookahead_reasoning"

# Triton input name -> (client data type, numpy dtype), derived from the request definition.
_NUMPY = {"STRING": ("BYTES", np.object_), "INT32": ("INT32", np.int32), "INT64": ("INT64", np.int64),
          "FP32": ("FP32", np.float32), "BOOL": ("BOOL", np.bool_)}
_TYPES = {f.triton: _NUMPY[f.dtype] for f in FIELDS}


class ServerError(RuntimeError):
    """The server answered the request with an error (its message names the field for bad input)."""


def transport_error(exc: BaseException, url: str) -> str:
    """One line for a failure to talk to the server at ``url`` (not an answer from it): a refused or dropped
    connection names the URL; other gRPC / HTTP failures give their status and details, never a traceback."""
    import grpc
    import httpx
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return f"cannot reach the server at {url} (gRPC): {exc.details()}"
        return f"server at {url} (gRPC): {exc.code().name}: {exc.details()}"
    if isinstance(exc, InferenceServerException):
        text = exc.message() or str(exc)
        if "UNAVAILABLE" in str(exc.status()) or "failed to connect" in text.lower():
            return f"cannot reach the server at {url}: {text}"
        return f"server at {url}: {text}".splitlines()[0]
    cause: BaseException | None = exc  # the openai client wraps httpx's error (APIConnectionError)
    while cause is not None:
        if isinstance(cause, (httpx.TransportError, ConnectionError)):
            return f"cannot reach the server at {url} (HTTP): {type(cause).__name__}: {cause}".splitlines()[0]
        cause = cause.__cause__ or cause.__context__
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


@dataclass
class StepChunk:
    """One streamed piece: the step text, its token count, who wrote it, arrival time (``time.perf_counter``);
    ``metrics`` is set on the final chunk only."""

    text: str
    token_count: int = 0
    source: str | None = None
    depth: int | None = None
    arrival_s: float = field(default_factory=time.perf_counter)
    metrics: dict | None = None


@dataclass
class Answer:
    text: str
    metrics: dict
    chunks: list[StepChunk]


def _inputs(prompt, messages, stream: bool, params: dict) -> dict[str, np.ndarray]:
    values: dict[str, object] = dict(params)
    if prompt is not None:
        values["text_input"] = prompt
    if messages is not None:
        values["messages"] = messages if isinstance(messages, str) else json.dumps(list(messages))
    values["stream"] = stream
    out = {}
    for name, v in values.items():
        if v is None:
            continue
        if name not in _TYPES:
            raise ValueError(f"{name}: unknown request parameter")
        _, dtype = _TYPES[name]
        if name == "stop":
            seq = [v] if isinstance(v, str) else list(v)
            out[name] = np.array([s.encode() for s in seq], dtype=np.object_)
        elif dtype is np.object_:
            out[name] = np.array([v.encode() if isinstance(v, str) else v], dtype=np.object_)
        else:
            out[name] = np.array([v], dtype=dtype)
    return out


def _chunk(text: str, metrics_json: str, stream: bool) -> StepChunk:
    """A response as a chunk: a step (its metrics hold ``step_tokens``) or the final response (the request's
    metrics; its text is the whole answer when not streaming, else what the server held back at a possible stop
    string, whose tokens were counted with their steps)."""
    info = json.loads(metrics_json) if metrics_json else {}
    if "step_tokens" in info:
        return StepChunk(text, info["step_tokens"], info.get("source"), info.get("depth"))
    return StepChunk(text, 0 if stream or not text else info.get("generated_tokens", 0), metrics=info or None)


class TritonLRClient:
    """Async client of the ``lookahead_reasoning`` model.

    Args:
        url: ``HOST:PORT`` of Triton's gRPC (``protocol="grpc"``) or HTTP (``protocol="http"``) endpoint.
        protocol: ``grpc`` (bidirectional streaming) or ``http`` (the generate extension; SSE for streaming).
        timeout_s: per-request timeout.
    """

    def __init__(self, url: str, protocol: str = "grpc", timeout_s: float = 600.0) -> None:
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol: must be grpc or http, got {protocol!r}")
        self.url, self.protocol, self.timeout_s = url, protocol, timeout_s

    async def stream(self, prompt: str | None = None, messages=None, **params) -> AsyncIterator[StepChunk]:
        """Yield steps as they are decided, then a final chunk with ``metrics``.

        Raises:
            ServerError: the server rejected or failed the request.
        """
        inputs = _inputs(prompt, messages, True, params)
        if self.protocol == "grpc":
            async for c in self._grpc(inputs, stream=True):
                yield c
        else:
            async for c in self._http(inputs, stream=True):
                yield c

    async def generate(self, prompt: str | None = None, messages=None, stream: bool = False, **params) -> Answer:
        """The whole answer (``stream=True`` collects streamed steps)."""
        if stream:
            chunks = [c async for c in self.stream(prompt, messages, **params)]
        else:
            inputs = _inputs(prompt, messages, False, params)
            gen = self._grpc(inputs, stream=False) if self.protocol == "grpc" else self._http(inputs, stream=False)
            chunks = [c async for c in gen]
        text = "".join(c.text for c in chunks)
        metrics = next((c.metrics for c in reversed(chunks) if c.metrics is not None), {})
        return Answer(text, metrics, chunks)

    async def _grpc(self, inputs: dict[str, np.ndarray], stream: bool) -> AsyncIterator[StepChunk]:
        import tritonclient.grpc.aio as grpcclient

        client = grpcclient.InferenceServerClient(self.url)
        infer_inputs = []
        for name, arr in inputs.items():
            t = grpcclient.InferInput(name, list(arr.shape), _TYPES[name][0])
            t.set_data_from_numpy(arr)
            infer_inputs.append(t)
        outputs = [grpcclient.InferRequestedOutput("text_output"), grpcclient.InferRequestedOutput("metrics")]

        async def requests():
            yield {"model_name": MODEL, "inputs": infer_inputs, "outputs": outputs,
                   "request_id": f"lr-{time.monotonic_ns()}", "enable_empty_final_response": True}

        try:
            stream = client.stream_infer(requests(), stream_timeout=self.timeout_s)
            async for result, error in stream:
                if error is not None:
                    raise ServerError(str(error.message() if hasattr(error, "message") else error))
                resp = result.get_response()
                final = resp.parameters.get("triton_final_response")
                text_arr, metrics_arr = result.as_numpy("text_output"), result.as_numpy("metrics")
                if text_arr is not None:
                    if text_arr.size != 1 or metrics_arr is None or metrics_arr.size != 1:
                        raise ServerError(f"malformed response: text_output shape {list(text_arr.shape)}, metrics "
                                          f"shape {None if metrics_arr is None else list(metrics_arr.shape)}")
                    yield _chunk(text_arr.reshape(-1)[0].decode(), metrics_arr.reshape(-1)[0].decode(), stream)
                if final is not None and final.bool_param:
                    break
        finally:
            await client.close()

    async def _http(self, inputs: dict[str, np.ndarray], stream: bool) -> AsyncIterator[StepChunk]:
        import httpx

        body = {}
        for name, arr in inputs.items():
            vals = [v.decode() if isinstance(v, bytes) else v.item() for v in arr.reshape(-1)]
            body[name] = vals if name == "stop" else vals[0]
        endpoint = "generate_stream" if stream else "generate"
        url = f"http://{self.url}/v2/models/{MODEL}/{endpoint}"
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            if not stream:
                r = await client.post(url, json=body)
                data = r.json()
                if r.status_code != 200 or "error" in data:
                    raise ServerError(data.get("error", r.text))
                yield _chunk(data.get("text_output", ""), data.get("metrics", ""), False)
                return
            async with client.stream("POST", url, json=body) as r:
                if r.status_code != 200:
                    raise ServerError((await r.aread()).decode(errors="replace"))
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = json.loads(line[5:])
                    if "error" in data:
                        raise ServerError(data["error"])
                    yield _chunk(data.get("text_output", ""), data.get("metrics", ""), True)

    async def server_profile(self) -> dict:
        """The serving profile's name and parameters, read from the model's configuration on the server."""
        import httpx

        if self.protocol == "grpc":
            import tritonclient.grpc.aio as grpcclient

            client = grpcclient.InferenceServerClient(self.url)
            try:
                cfg = (await client.get_model_config(MODEL, as_json=True))["config"]
            finally:
                await client.close()
        else:
            async with httpx.AsyncClient(timeout=30) as client:
                cfg = (await client.get(f"http://{self.url}/v2/models/{MODEL}/config")).json()
        params = {k: v.get("string_value") for k, v in (cfg.get("parameters") or {}).items()}
        return {"profile": params.get("profile") or None, "parameters": params}
