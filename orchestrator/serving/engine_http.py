"""A small OpenAI-compatible HTTP server over ONE engine (FastAPI + uvicorn; loopback by default).

Serves any :class:`~lookahead_reasoning.backends.base.Engine` (typically the portable engine of one role) so
that the OpenAI-compatible backend (:mod:`lookahead_reasoning.backends.openai_http`) can use it from another
process or host, exactly as it uses trtllm-serve or vLLM.

Endpoints:

- ``GET /health``: 200 when the engine is up.
- ``GET /v1/models``: the served model (``{"object": "list", "data": [{"id": NAME, ...}]}``).
- ``POST /v1/completions``: ``prompt`` as text, a list of token ids, or a batch of either; ``max_tokens``
  (default 16, as OpenAI), ``stop`` (string or list), ``temperature`` (default 1.0, as OpenAI; 0 = greedy),
  ``top_p``, ``top_k`` (0 = off), ``seed``; extensions as vLLM: ``return_token_ids`` (default true here),
  ``include_stop_str_in_output`` (default false: ``text`` ends before the stop string; ``token_ids`` always
  keep the token that completed it, as vLLM's do), ``skip_special_tokens``. Each choice carries ``text``,
  ``token_ids``, ``prompt_token_ids``, ``finish_reason`` (``stop`` | ``length``) and ``stop_reason`` (the
  stop string, the EOS token id, or null); ``usage`` counts tokens, with prefix-cache hits in
  ``usage.prompt_tokens_details.cached_tokens``. Text prompts are encoded without special tokens.

Errors: invalid input -> HTTP 400 (404 for an unknown ``model``) with an OpenAI-style body
``{"error": {"message": "FIELD: ...", "type": "invalid_request_error", "param": FIELD, "code": 400}}``; the
server keeps serving. Streaming, ``n > 1``, ``logprobs``, ``echo``, ``suffix`` and penalties are refused with
400 naming the field.

Run: ``python -m lookahead_reasoning.serving.engine_http --model engines/demo/target --port 8001``.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..backends.base import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)

#: Engine-interface field -> API field, for error messages raised by the engine.
_REQUEST_TO_API = {"prompt_ids": "prompt", "max_new_tokens": "max_tokens", "stop": "stop",
                   "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed"}


class CompletionRequest(BaseModel):
    """Body of ``POST /v1/completions`` (OpenAI fields plus vLLM's ``top_k`` / ``return_token_ids`` /
    ``include_stop_str_in_output`` / ``skip_special_tokens``). Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    stop: str | list[str] | None = None
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 = off")
    seed: int | None = Field(None, ge=0)
    return_token_ids: bool = True
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Accepted only with their neutral values (OpenAI clients may send them explicitly).
    n: int = Field(1, ge=1, le=1, description="one choice per prompt")
    stream: Literal[False] = False
    logprobs: None = None
    echo: Literal[False] = False
    suffix: None = None
    best_of: int | None = Field(None, ge=1, le=1)
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0)
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0)
    user: str | None = None

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, list) and len(v) == 0:
            raise ValueError("empty prompt list")
        if isinstance(v, str) and v == "":
            raise ValueError("empty prompt")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if any(s == "" for s in stops):
            raise ValueError("stop strings must be non-empty")
        if len(stops) > 16:
            raise ValueError("at most 16 stop strings")
        return stops

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts (one element for a single prompt)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def sampling(self) -> SamplingParams:
        if self.temperature == 0.0:
            return SamplingParams(seed=self.seed)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0),
                              seed=self.seed)


class _ApiError(Exception):
    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def _error_body(status: int, field: str, message: str) -> dict:
    text = f"{field}: {message}" if field and not message.startswith(f"{field}:") else message
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": text, "type": kind, "param": field or None, "code": status}}


def _engine_error(exc: ValueError) -> _ApiError:
    """Turn an engine ``ValueError("field: msg")`` into a 400 naming the API field."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid request"
    head, sep, rest = text.partition(":")
    if sep and head in _REQUEST_TO_API:
        return _ApiError(400, _REQUEST_TO_API[head], rest.strip())
    return _ApiError(400, "", text)


async def _invalid_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """HTTP 400 naming the body field pydantic refused (its message without pydantic's ``Value error, ``)."""
    from fastapi.responses import JSONResponse

    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body" and not isinstance(x, int)]
    # Union members appear in the location (prompt.str, prompt.list[int]): keep the field name only.
    field = loc[0] if loc else ""
    msg = str(first.get("msg", "invalid request")).replace("Value error, ", "")
    return JSONResponse(_error_body(400, field, msg), status_code=400)


async def _api_error(_request: Request, exc: _ApiError) -> JSONResponse:
    """The OpenAI-style error body of an :class:`_ApiError`, with its HTTP status."""
    from fastapi.responses import JSONResponse

    return JSONResponse(_error_body(exc.status, exc.field, exc.message), status_code=exc.status)


def _prompt_ids(engine, body: CompletionRequest) -> list[list[int]]:
    """The batch's prompts as token ids (text encoded by ``engine``, without special tokens); raises
    :class:`_ApiError` (400) for a text that encodes to no tokens."""
    prompts = []
    for p in body.prompts():
        if isinstance(p, str):
            p = engine.encode(p)
            if not p:
                raise _ApiError(400, "prompt", "prompt encodes to no tokens")
        prompts.append(p)
    return prompts


def _choice(engine, body: CompletionRequest, index: int, req: GenerationRequest, res) -> dict:
    """One ``choices`` entry: the text (cut before the stop string unless ``include_stop_str_in_output``),
    ``finish_reason``, ``stop_reason`` (the stop string, the EOS token id, or None) and the token ids if asked."""
    text = res.text
    if not body.skip_special_tokens:
        text = engine.tokenizer.decode(res.token_ids, skip_special_tokens=False)
    stop_reason: Any = None
    if res.finish_reason == "stop":
        hits = [(text.find(s), s) for s in tuple(body.stop or ()) if s in text]
        if hits:
            at, stop_reason = min(hits)
            if not body.include_stop_str_in_output:
                text = text[:at]
    elif res.finish_reason == "eos" and res.token_ids:
        stop_reason = int(res.token_ids[-1])
    choice = {
        "index": index, "text": text, "logprobs": None,
        "finish_reason": "length" if res.finish_reason == "length" else "stop",
        "stop_reason": stop_reason,
    }
    if body.return_token_ids:
        choice["token_ids"] = list(res.token_ids)
        choice["prompt_token_ids"] = list(req.prompt_ids)
    return choice


def _usage(pairs: list[tuple[GenerationRequest, Any]]) -> dict:
    """OpenAI's ``usage`` of the batch's ``(request, result)`` pairs (token counts), with prefix-cache hits in
    ``prompt_tokens_details.cached_tokens``."""
    n_prompt = sum(len(req.prompt_ids) for req, _ in pairs)
    n_out = sum(len(res.token_ids) for _, res in pairs)
    n_cached = sum(int(res.counters.prefill_tokens_cached) for _, res in pairs)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": n_cached}}


async def _complete(engine, model_name: str, body: CompletionRequest) -> dict:
    """The ``text_completion`` answer to ``body`` (one choice per prompt, generated as one batch).

    Raises:
        _ApiError: 404 for another ``model``; 400 for a prompt with no tokens or input the engine refuses.
    """
    if body.model is not None and body.model != model_name:
        raise _ApiError(404, "model", f"unknown model {body.model!r} (this server serves {model_name!r})")
    stops = tuple(body.stop or ())
    sampling = body.sampling()
    prompts = _prompt_ids(engine, body)
    try:
        reqs = [GenerationRequest(tuple(p), body.max_tokens, stop=stops, sampling=sampling,
                                  request_id=f"http-{uuid.uuid4().hex[:12]}") for p in prompts]
        results = await engine.agenerate(reqs)
    except ValueError as exc:
        raise _engine_error(exc) from None
    pairs = list(zip(reqs, results, strict=False))
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
        "model": model_name, "choices": [_choice(engine, body, i, req, res) for i, (req, res) in enumerate(pairs)],
        "usage": _usage(pairs),
    }


def create_app(engine, model_name: str) -> FastAPI:
    """The FastAPI application serving ``engine`` under the name ``model_name``."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="lookahead-reasoning engine server", version="1")
    created = int(time.time())
    app.add_exception_handler(RequestValidationError, _invalid_body)
    app.add_exception_handler(_ApiError, _api_error)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "lookahead-reasoning",
            "max_model_len": engine.context_length,
        }]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await _complete(engine, model_name, body)

    return app


class ServerHandle:
    """A server running in a background thread: ``url``, ``stop()``; also a context manager."""

    def __init__(self, server, thread: threading.Thread, host: str, port: int) -> None:
        self._server, self._thread = server, thread
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=timeout_s)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(engine, model_name: str = "model", host: str = "127.0.0.1", port: int = 0,
                 ready_timeout_s: float = 30.0) -> ServerHandle:
    """Start the server in a background thread and wait until it accepts connections.

    ``port=0`` picks a free port (read it from the handle). Raises ``RuntimeError`` if it does not start.
    """
    import socket

    import uvicorn

    if port == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    config = uvicorn.Config(create_app(engine, model_name), host=host, port=port, log_level="warning",
                            lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"engine-http-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"engine HTTP server did not start on {host}:{port}")
        time.sleep(0.02)
    return ServerHandle(server, thread, host, port)


def main(argv: list[str] | None = None) -> int:
    """``python -m lookahead_reasoning.serving.engine_http``: serve one portable-engine checkpoint."""
    import os

    import uvicorn

    from ..backends.portable import PortableEngine

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m lookahead_reasoning.serving.engine_http", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (portable engine)")
    p.add_argument("--served-model-name", default=None, help="name in /v1/models (default: folder name)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the engine")
    p.add_argument("--max-batch-size", type=int, default=64)
    args = p.parse_args(argv)
    engine = PortableEngine.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                            num_threads=args.threads, max_batch_size=args.max_batch_size)
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    try:
        uvicorn.run(create_app(engine, name), host=args.host, port=args.port, log_level="info")
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
