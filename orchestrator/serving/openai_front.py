"""OpenAI-compatible HTTP front (FastAPI) that forwards to the Triton server over gRPC.

Endpoints as vLLM / trtllm-serve users expect: ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (``stream: true`` gives server-sent events ending with ``data: [DONE]``, one
chunk per decided reasoning step; ``stream_options: {"include_usage": true}`` adds OpenAI's last chunk with
empty ``choices`` and the ``usage``). Request fields follow the OpenAI API (``prompt`` / ``messages``,
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``stream``) plus the extensions ``top_k``,
``mode``, ``gamma`` and ``judge``. Bad input answers HTTP 400 with ``{"error": {"message", "type", "param"}}``.
As in OpenAI's API and vLLM, the matched stop string is left out of the text (vLLM's
``include_stop_str_in_output: true`` keeps it); the server does it, as on every front.

A completion's ``prompt`` may be a string, a list of strings (one choice per prompt, ``index`` in order; streamed
chunks of the choices interleave) or token ids (a list of ints, or one list per prompt), which this front decodes
with the served target's tokenizer before sending the text (the server tokenizes it again: ids that are not the
tokenizer's own encoding of their text come back as that encoding). Chat ``content`` may be a list of text parts.

Reasoning: with the profile's ``reasoning_parser`` (``deepseek_r1`` or ``qwen3``, vLLM's names) a chat answer
is split as vLLM's reasoning parsers do: the trace goes to ``message.reasoning_content`` (and ``reasoning``, its
name since vLLM 0.11), the final answer to ``content``; streamed deltas carry one or the other. Completions
(``/v1/completions``) return the raw text.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, create_model

from ..core.request import BY_NAME, FIELDS, RequestError, openai_body_fields, translate
from ..core.steps import ReasoningStream, split_reasoning
from .client import ServerError, TritonLRClient


class StreamOptions(BaseModel):
    """OpenAI's ``stream_options``: ``include_usage`` adds a last chunk (empty ``choices``) with the usage."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str | None = None
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = None  # OpenAI's newer name of max_tokens
    # OpenAI parameters this server does not implement: refused by name rather than ignored
    n: int | None = None
    best_of: int | None = None
    logprobs: Any = None
    top_logprobs: int | None = None
    echo: bool | None = None
    tools: list | None = None
    response_format: dict | None = None

    def unsupported(self) -> str | None:
        """The first OpenAI parameter set to something this server does not do, as ``"name: why"``."""
        if self.n not in (None, 1) or self.best_of not in (None, 1):
            return f"{'n' if self.n not in (None, 1) else 'best_of'}: only one choice per request is supported"
        for name in ("logprobs", "top_logprobs", "echo", "tools"):
            if getattr(self, name) not in (None, False, [], 0):
                return f"{name}: not supported by this server"
        if self.response_format not in (None, {"type": "text"}):
            return "response_format: only text is supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options: only allowed when stream is true"
        return None

    def params(self) -> dict[str, Any]:
        """The request's option fields set in this body, by Triton input name (the server validates them; the
        prompt or messages and ``stream`` are how the endpoint talks to the server, not forwarded here)."""
        skip = ("prompt", "messages", "stream")
        values = {f.name: getattr(self, f.name) for f in FIELDS if f.name not in skip and f.name in type(self).model_fields}
        if self.max_completion_tokens is not None:
            values["max_tokens"] = self.max_completion_tokens
        return {BY_NAME[k].triton: v for k, v in values.items() if v is not None}


# The body's request fields come from the one request definition (OpenAI names as aliases).
_Common = create_model("_Common", __base__=_Body, **openai_body_fields())


class CompletionRequest(_Common):
    # text, several texts (one choice each), or token ids (one list, or one list per prompt)
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class ChatRequest(_Common):
    messages: list[dict]  # checked by the server (one definition: lookahead_reasoning.core.request.Message)


def _usage(*metrics: dict) -> dict[str, int]:
    """OpenAI's ``usage`` object from the metrics of a request's answers (one per prompt)."""
    prompt = sum(m.get("prompt_tokens", 0) for m in metrics)
    completion = sum(m.get("generated_tokens", 0) for m in metrics)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _target_tokenizer(server_profile: dict):
    """The served profile's target tokenizer (token-id prompts are decoded with it)."""
    from transformers import AutoTokenizer

    from ..profiles import load_profile

    params = server_profile["parameters"]
    prof = load_profile(params.get("profile") or None, config=params.get("profile_config") or None)
    return AutoTokenizer.from_pretrained(str(prof.target.tokenizer_path()))


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def create_app(grpc_url: str, model_name: str | None = None):
    """The FastAPI application forwarding to Triton at ``grpc_url`` (``HOST:PORT``)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="Lookahead Reasoning (OpenAI-compatible)")
    client = TritonLRClient(grpc_url, "grpc")
    state: dict[str, str] = {}

    async def server_facts() -> dict[str, str]:
        if not state:
            prof = await client.server_profile()
            state["name"] = prof.get("profile") or "lookahead-reasoning"
            state["reasoning_parser"] = prof["parameters"].get("reasoning_parser") or "none"
        return state

    async def served_model() -> str:
        return model_name or (await server_facts())["name"]

    def error(status: int, message: str, param: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content={
            "error": {"message": message, "type": "invalid_request_error" if status == 400 else "server_error",
                      "param": param, "code": None}})

    def bad_request(exc: BaseException) -> JSONResponse:
        """HTTP 400 for a request the server refused: its message names the field as Triton calls it, renamed
        to this front's terms (``text_input`` -> ``prompt``)."""
        line = translate(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, "triton", "openai")
        head, sep, _ = line.partition(":")
        return error(400, line, head if sep and " " not in head else None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        """HTTP 400 naming the body field (``messages[1].content``); a body that is not a JSON object gets one
        sentence saying so, never pydantic's dump of the error (which names our source files)."""
        from ..core.errors import field_path, is_type_tag

        first = exc.errors()[0] if exc.errors() else {}
        loc = tuple(x for x in first.get("loc", ()) if x != "body")
        param = field_path(loc) or None
        if param is None or first.get("type") in ("json_invalid", "model_attributes_type", "dict_type"):
            ctype = request.headers.get("content-type", "")
            hint = "" if "json" in ctype else " (send the header Content-Type: application/json)"
            return error(400, f"body: expected a JSON object{hint}", "body")
        msg = first.get("msg", "invalid request")
        if any(is_type_tag(x) for x in loc):  # a union (prompt: text, texts or token ids): none of its types fit
            msg = f"not any of the accepted types ({msg.lower()} or ...)"
        return error(400, f"{param}: {msg}", param)

    def unknown_model(asked: str, served: str) -> JSONResponse:
        """HTTP 404 with OpenAI's ``model_not_found`` error body."""
        return JSONResponse(status_code=404, content={"error": {
            "message": f"model: {asked!r} does not exist (this server serves {served!r})",
            "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})

    async def model_card() -> dict:
        return {"id": await served_model(), "object": "model", "created": 0, "owned_by": "lookahead-reasoning"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [await model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        card = await model_card()
        return card if model_id == card["id"] else unknown_model(model_id, card["id"])

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    async def prompt_texts(prompt) -> list[str]:
        """The completion request's prompts as text: a string, a list of strings, or token ids (one list of
        ints, or a list of them) decoded with the served target's tokenizer."""
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise RequestError("prompt", "expected a string, a non-empty list of strings, or token ids")
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        flat = all(isinstance(t, int) for t in prompt)
        rows = [prompt] if flat else prompt
        if "tokenizer" not in state:
            state["tokenizer"] = await asyncio.to_thread(_target_tokenizer, await client.server_profile())
        tok = state["tokenizer"]
        for r, row in enumerate(rows):
            if not row:
                raise RequestError(f"prompt[{r}]", "empty token list")
            bad = [t for t in row if not 0 <= t < len(tok)]
            if bad:
                raise RequestError("prompt" if flat else f"prompt[{r}]",
                                   f"token id {bad[0]} is outside the vocabulary (0..{len(tok) - 1})")
        return [tok.decode(row, clean_up_tokenization_spaces=False) for row in rows]

    async def run(kind: str, body: _Common, prompt=None, messages=None):
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        name = await served_model()
        if body.model is not None and body.model != name:
            return unknown_model(body.model, name)
        refused = body.unsupported()
        if refused:
            return error(400, refused, refused.split(":")[0])
        params = body.params()
        try:
            inputs = [(p, None) for p in await prompt_texts(prompt)] if kind == "completion" else [(None, messages)]
        except RequestError as exc:
            return error(400, str(exc), exc.field)
        parser = (await server_facts())["reasoning_parser"] if kind == "chat" else None

        if not body.stream:
            try:
                answers = await asyncio.gather(*(client.generate(p, m, **params) for p, m in inputs))
            except (ServerError, ValueError) as exc:
                return bad_request(exc)
            choices = []
            for index, ans in enumerate(answers):
                m = ans.metrics
                finish = _finish(m.get("finish_reason"))
                text = ans.text  # the server left the stop string out (unless include_stop_str_in_output)
                if kind == "chat":
                    reasoning, content = split_reasoning(text, parser)
                    message = {"role": "assistant", "content": content}
                    if reasoning is not None:  # vLLM's field names (``reasoning`` in vLLM >= 0.11)
                        message["reasoning_content"] = message["reasoning"] = reasoning
                    choices.append({"index": index, "message": message, "finish_reason": finish})
                else:
                    choices.append({"index": index, "text": text, "finish_reason": finish, "logprobs": None})
            metrics = [a.metrics for a in answers]
            return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
                    "created": created, "model": name, "choices": choices, "usage": _usage(*metrics),
                    "lookahead_metrics": metrics[0] if len(metrics) == 1 else metrics}

        agens = [client.stream(p, m, **params) for p, m in inputs]

        async def first_of(agen):
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return None

        try:  # surface bad-request errors as HTTP 400 before the event stream starts
            firsts = await asyncio.gather(*(first_of(a) for a in agens))
        except (ServerError, ValueError) as exc:
            for a in agens:
                await a.aclose()
            return bad_request(exc)
        with_usage = body.stream_options is not None and body.stream_options.include_usage

        def sse(choices: list, usage: dict | None = None, last: bool = False) -> str:
            payload = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                       "created": created, "model": name, "choices": choices}
            if with_usage:
                payload["usage"] = usage if last else None
            return f"data: {json.dumps(payload)}\n\n"

        def choice(index: int, text: str | None, finish: str | None, first_chunk: bool = False,
                   reasoning: str = "") -> dict:
            if kind != "chat":
                return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
            delta: dict[str, Any] = {}
            if first_chunk:
                delta["role"] = "assistant"
            if reasoning:
                delta["reasoning_content"] = delta["reasoning"] = reasoning
            if text:
                delta["content"] = text
            return {"index": index, "delta": delta, "finish_reason": finish}

        async def one_choice(index: int, first, agen, final_metrics: list):
            """This choice's chunks (as ``choices`` entries); its metrics go to ``final_metrics[index]``."""
            splitter = ReasoningStream(parser) if kind == "chat" else None
            first_chunk = True
            pending = [first] if first is not None else []
            while True:
                if pending:
                    c = pending.pop()
                else:
                    try:
                        c = await agen.__anext__()
                    except StopAsyncIteration:
                        break
                if c.metrics is not None:
                    final_metrics[index] = c.metrics
                    rest = c.text  # what the server held back at a possible stop string (usually "")
                    reasoning, text = splitter.feed(rest) if splitter is not None else ("", rest)
                    if splitter is not None:
                        r2, t2 = splitter.flush()
                        reasoning, text = reasoning + r2, text + t2
                    if reasoning or text:
                        yield choice(index, text, None, first_chunk, reasoning)
                    yield choice(index, None if kind == "chat" else "", _finish(c.metrics.get("finish_reason")))
                    break
                piece = c.text
                reasoning, text = splitter.feed(piece) if splitter is not None else ("", piece)
                if reasoning or text or first_chunk:
                    yield choice(index, text, None, first_chunk, reasoning)
                    first_chunk = False

        async def events():
            final_metrics: list = [None] * len(agens)
            queue: asyncio.Queue = asyncio.Queue()
            done = object()

            async def pump(index: int):
                try:
                    async for c in one_choice(index, firsts[index], agens[index], final_metrics):
                        await queue.put(c)
                except (ServerError, ValueError) as exc:
                    await queue.put(exc)
                finally:
                    await queue.put(done)

            tasks = [asyncio.ensure_future(pump(i)) for i in range(len(agens))]
            try:
                running = len(tasks)
                while running:
                    item = await queue.get()
                    if item is done:
                        running -= 1
                    elif isinstance(item, Exception):
                        yield f"data: {json.dumps({'error': {'message': str(item), 'type': 'server_error'}})}\n\n"
                    else:
                        yield sse([item])
                if with_usage and all(m is not None for m in final_metrics):
                    yield sse([], _usage(*final_metrics), last=True)
            finally:
                for t in tasks:
                    t.cancel()
                for a in agens:
                    await a.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await run("completion", body, prompt=body.prompt)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        return await run("chat", body, messages=body.messages)

    return app


class RunningFront:
    """A uvicorn server running :func:`create_app` in a background thread."""

    def __init__(self, server, thread: threading.Thread) -> None:
        self.server, self.thread = server, thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_front(grpc_url: str, host: str = "127.0.0.1", port: int = 9000, model_name: str | None = None) -> RunningFront:
    """Start the front on ``host:port`` (loopback by default) and return once it accepts connections."""
    import uvicorn

    config = uvicorn.Config(create_app(grpc_url, model_name), host=host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="openai-front", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError(f"OpenAI-compatible front failed to start on {host}:{port}")
        time.sleep(0.05)
    return RunningFront(server, thread)
