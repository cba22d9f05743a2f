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
import contextlib
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, create_model

from ..core.request import BY_NAME, FIELDS, RequestError, openai_body_fields, translate
from ..core.steps import ReasoningStream, split_reasoning
from .client import ServerError, TritonLRClient

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse


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
        fields = type(self).model_fields
        values = {f.name: getattr(self, f.name) for f in FIELDS if f.name not in skip and f.name in fields}
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
    """OpenAI's ``finish_reason`` from the server's: ``length`` stays, anything else is ``stop``."""
    return "length" if reason == "length" else "stop"


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    """OpenAI's error body ``{"error": {"message", "type", "param", "code": None}}`` with HTTP ``status``
    (type ``invalid_request_error`` for 400, else ``server_error``)."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={
        "error": {"message": message, "type": "invalid_request_error" if status == 400 else "server_error",
                  "param": param, "code": None}})


def _bad_request(exc: BaseException) -> JSONResponse:
    """HTTP 400 for a request the server refused: its message names the field as Triton calls it, renamed
    to this front's terms (``text_input`` -> ``prompt``)."""
    text = str(exc).strip()
    line = translate(text.splitlines()[0] if text else type(exc).__name__, "triton", "openai")
    head, sep, _ = line.partition(":")
    return _error(400, line, head if sep and " " not in head else None)


def _unknown_model(asked: str, served: str) -> JSONResponse:
    """HTTP 404 with OpenAI's ``model_not_found`` error body."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=404, content={"error": {
        "message": f"model: {asked!r} does not exist (this server serves {served!r})",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})


async def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    """HTTP 400 naming the body field (``messages[1].content``); a body that is not a JSON object gets one
    sentence saying so, never pydantic's dump of the error (which names our source files)."""
    from ..core.errors import field_path, is_type_tag

    first = exc.errors()[0] if exc.errors() else {}
    loc = tuple(x for x in first.get("loc", ()) if x != "body")
    param = field_path(loc) or None
    if param is None or first.get("type") in ("json_invalid", "model_attributes_type", "dict_type"):
        ctype = request.headers.get("content-type", "")
        hint = "" if "json" in ctype else " (send the header Content-Type: application/json)"
        return _error(400, f"body: expected a JSON object{hint}", "body")
    msg = first.get("msg", "invalid request")
    if any(is_type_tag(x) for x in loc):  # a union (prompt: text, texts or token ids): none of its types fit
        msg = f"not any of the accepted types ({msg.lower()} or ...)"
    return _error(400, f"{param}: {msg}", param)


@dataclass
class _Reply:
    """What every answer or chunk of one request repeats: the endpoint (``chat`` | ``completion``), the
    response id, its creation time (Unix seconds) and the served model's name."""

    kind: str
    id: str
    created: int
    model: str = ""

    @classmethod
    def new(cls, kind: str) -> _Reply:
        """A fresh id (``chatcmpl-...`` or ``cmpl-...``) created now; the model name is set by the caller."""
        return cls(kind, f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time()))

    def sse(self, choices: list, with_usage: bool, usage: dict | None = None, last: bool = False) -> str:
        """One server-sent event of a streamed answer (``usage`` is null in every chunk but the last)."""
        payload = {"id": self.id, "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
                   "created": self.created, "model": self.model, "choices": choices}
        if with_usage:
            payload["usage"] = usage if last else None
        return f"data: {json.dumps(payload)}\n\n"


def _answer_choice(kind: str, index: int, answer, parser: str | None) -> dict:
    """The ``choices`` entry of one whole answer: a chat ``message`` (the reasoning split out with ``parser``)
    or a completion's ``text``."""
    finish = _finish(answer.metrics.get("finish_reason"))
    text = answer.text  # the server left the stop string out (unless include_stop_str_in_output)
    if kind != "chat":
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
    reasoning, content = split_reasoning(text, parser)
    message = {"role": "assistant", "content": content}
    if reasoning is not None:  # vLLM's field names (``reasoning`` in vLLM >= 0.11)
        message["reasoning_content"] = message["reasoning"] = reasoning
    return {"index": index, "message": message, "finish_reason": finish}


def _answer_body(reply: _Reply, answers: list, parser: str | None) -> dict:
    """The non-streamed response: one choice per answer, the summed ``usage`` and the server's metrics
    (``lookahead_metrics``: one dict, or a list of them for several prompts)."""
    choices = [_answer_choice(reply.kind, index, ans, parser) for index, ans in enumerate(answers)]
    metrics = [a.metrics for a in answers]
    return {"id": reply.id, "object": "chat.completion" if reply.kind == "chat" else "text_completion",
            "created": reply.created, "model": reply.model, "choices": choices, "usage": _usage(*metrics),
            "lookahead_metrics": metrics[0] if len(metrics) == 1 else metrics}


class _ChoiceDeltas:
    """One streamed choice's ``choices`` entries, from the server's chunks: completions pass the text on; chat
    sends ``delta`` objects (``role`` in the first, the reasoning split out as ``reasoning_content``)."""

    def __init__(self, kind: str, index: int, parser: str | None) -> None:
        self.kind, self.index = kind, index
        self.splitter = ReasoningStream(parser) if kind == "chat" else None
        self.first = True  # no entry sent yet

    def entry(self, text: str | None, finish: str | None, first: bool = False, reasoning: str = "") -> dict:
        """One ``choices`` entry: a completion's ``text`` or a chat ``delta``."""
        if self.kind != "chat":
            return {"index": self.index, "text": text or "", "finish_reason": finish, "logprobs": None}
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if reasoning:
            delta["reasoning_content"] = delta["reasoning"] = reasoning
        if text:
            delta["content"] = text
        return {"index": self.index, "delta": delta, "finish_reason": finish}

    def step(self, piece: str) -> list[dict]:
        """The entry of one decided step's text (none where the splitter holds all of it back, except the
        first, which carries the role)."""
        reasoning, text = self.splitter.feed(piece) if self.splitter is not None else ("", piece)
        if not (reasoning or text or self.first):
            return []
        out = [self.entry(text, None, self.first, reasoning)]
        self.first = False
        return out

    def last(self, rest: str, finish_reason: str | None) -> list[dict]:
        """The entries of the final chunk: the text held back (by the server at a possible stop string, or by
        the splitter at a possible tag), if any, then the one with the ``finish_reason``."""
        reasoning, text = self.splitter.feed(rest) if self.splitter is not None else ("", rest)
        if self.splitter is not None:
            r2, t2 = self.splitter.flush()
            reasoning, text = reasoning + r2, text + t2
        out = [self.entry(text, None, self.first, reasoning)] if reasoning or text else []
        return out + [self.entry(None if self.kind == "chat" else "", _finish(finish_reason))]


async def _next_chunk(agen):
    """The stream's next chunk, or None at its end."""
    try:
        return await agen.__anext__()
    except StopAsyncIteration:
        return None


async def _choice_entries(kind: str, parser: str | None, index: int, first, agen, final_metrics: list):
    """This choice's ``choices`` entries, from its first chunk (None: none came) and the rest of ``agen``; its
    metrics go to ``final_metrics[index]``."""
    deltas = _ChoiceDeltas(kind, index, parser)
    c = first
    while c is not None:
        if c.metrics is not None:
            final_metrics[index] = c.metrics
            for entry in deltas.last(c.text, c.metrics.get("finish_reason")):
                yield entry
            return
        for entry in deltas.step(c.text):
            yield entry
        c = await _next_chunk(agen)


async def _merged(gens: list):
    """The items of the async generators ``gens`` as they come (each runs as a task); a server error of one
    comes as the exception (its choice ends there). The tasks are cancelled when this ends or is closed."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(gen):
        """Put ``gen``'s items (or its server error) on the queue, then the end marker."""
        try:
            async for item in gen:
                await queue.put(item)
        except (ServerError, ValueError) as exc:
            await queue.put(exc)
        finally:
            await queue.put(done)

    tasks = [asyncio.ensure_future(pump(g)) for g in gens]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is done:
                running -= 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()


async def _events(reply: _Reply, with_usage: bool, choices: list, agens: list, final_metrics: list):
    """The server-sent events of a streamed answer: one per ``choices`` entry (an error event for a server
    error), the usage chunk where asked, then ``data: [DONE]``; the server streams are closed at the end."""
    try:
        async with contextlib.aclosing(_merged(choices)) as items:
            async for item in items:
                if isinstance(item, Exception):
                    yield f"data: {json.dumps({'error': {'message': str(item), 'type': 'server_error'}})}\n\n"
                else:
                    yield reply.sse([item], with_usage)
        if with_usage and all(m is not None for m in final_metrics):
            yield reply.sse([], with_usage, _usage(*final_metrics), last=True)
    finally:
        for a in agens:
            await a.aclose()
    yield "data: [DONE]\n\n"


class _Front:
    """The front's state: the gRPC client of the Triton server, the served model's name and facts (read from
    the server once) and the target's tokenizer (loaded at the first token-id prompt)."""

    def __init__(self, grpc_url: str, model_name: str | None) -> None:
        self.client = TritonLRClient(grpc_url, "grpc")
        self.model_name = model_name
        self.facts: dict[str, str] = {}
        self.tokenizer = None

    async def server_facts(self) -> dict[str, str]:
        """``{"name", "reasoning_parser"}`` of the served profile (``"none"`` without a parser)."""
        if not self.facts:
            prof = await self.client.server_profile()
            self.facts["name"] = prof.get("profile") or "lookahead-reasoning"
            self.facts["reasoning_parser"] = prof["parameters"].get("reasoning_parser") or "none"
        return self.facts

    async def served_model(self) -> str:
        """The model name clients must use: the one given at start, else the profile's."""
        return self.model_name or (await self.server_facts())["name"]

    async def model_card(self) -> dict:
        """The served model as ``/v1/models`` lists it."""
        return {"id": await self.served_model(), "object": "model", "created": 0, "owned_by": "lookahead-reasoning"}

    async def prompt_texts(self, prompt) -> list[str]:
        """The completion request's prompts as text: a string, a list of strings, or token ids (one list of
        ints, or a list of them) decoded with the served target's tokenizer.

        Raises:
            RequestError: an empty list, an empty token list, or a token id outside the vocabulary.
        """
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise RequestError("prompt", "expected a string, a non-empty list of strings, or token ids")
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        flat = all(isinstance(t, int) for t in prompt)
        rows = [prompt] if flat else prompt
        if self.tokenizer is None:
            self.tokenizer = await asyncio.to_thread(_target_tokenizer, await self.client.server_profile())
        tok = self.tokenizer
        for r, row in enumerate(rows):
            if not row:
                raise RequestError(f"prompt[{r}]", "empty token list")
            bad = [t for t in row if not 0 <= t < len(tok)]
            if bad:
                raise RequestError("prompt" if flat else f"prompt[{r}]",
                                   f"token id {bad[0]} is outside the vocabulary (0..{len(tok) - 1})")
        return [tok.decode(row, clean_up_tokenization_spaces=False) for row in rows]

    async def answer(self, kind: str, body: _Common, prompt=None, messages=None):
        """The response to a ``chat`` or ``completion`` request: its answer (a dict, or a stream of events), or
        the error response (404 for another model, 400 for a refused parameter, bad prompt or server refusal)."""
        reply = _Reply.new(kind)
        reply.model = await self.served_model()
        if body.model is not None and body.model != reply.model:
            return _unknown_model(body.model, reply.model)
        refused = body.unsupported()
        if refused:
            return _error(400, refused, refused.split(":")[0])
        params = body.params()
        try:
            prompts = await self.prompt_texts(prompt) if kind == "completion" else [None]
        except RequestError as exc:
            return _error(400, str(exc), exc.field)
        inputs = [(p, messages) for p in prompts]  # completions have no messages, chat no prompt
        parser = (await self.server_facts())["reasoning_parser"] if kind == "chat" else None
        if not body.stream:
            return await self.whole(reply, inputs, params, parser)
        with_usage = body.stream_options is not None and body.stream_options.include_usage
        return await self.streamed(reply, inputs, params, parser, with_usage)

    async def whole(self, reply: _Reply, inputs: list, params: dict, parser: str | None):
        """The non-streamed answer to ``inputs`` (``(prompt, messages)`` pairs, one choice each), or HTTP 400
        where the server refuses the request."""
        try:
            answers = await asyncio.gather(*(self.client.generate(p, m, **params) for p, m in inputs))
        except (ServerError, ValueError) as exc:
            return _bad_request(exc)
        return _answer_body(reply, answers, parser)

    async def streamed(self, reply: _Reply, inputs: list, params: dict, parser: str | None, with_usage: bool):
        """The streamed answer to ``inputs`` (one choice each, their chunks interleaved), or HTTP 400 where the
        server refuses the request (its first chunk is awaited before the event stream starts)."""
        from fastapi.responses import StreamingResponse

        agens = [self.client.stream(p, m, **params) for p, m in inputs]
        try:
            firsts = await asyncio.gather(*(_next_chunk(a) for a in agens))
        except (ServerError, ValueError) as exc:
            for a in agens:
                await a.aclose()
            return _bad_request(exc)
        final_metrics: list = [None] * len(agens)
        choices = [_choice_entries(reply.kind, parser, i, first, agen, final_metrics)
                   for i, (first, agen) in enumerate(zip(firsts, agens, strict=True))]
        return StreamingResponse(_events(reply, with_usage, choices, agens, final_metrics),
                                 media_type="text/event-stream")


def create_app(grpc_url: str, model_name: str | None = None) -> FastAPI:
    """The FastAPI application forwarding to Triton at ``grpc_url`` (``HOST:PORT``); ``model_name`` is the
    name served in ``/v1/models`` (default: the profile's)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="Lookahead Reasoning (OpenAI-compatible)")
    front = _Front(grpc_url, model_name)
    app.add_exception_handler(RequestValidationError, _invalid_body)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [await front.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        card = await front.model_card()
        return card if model_id == card["id"] else _unknown_model(model_id, card["id"])

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await front.answer("completion", body, prompt=body.prompt)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        return await front.answer("chat", body, messages=body.messages)

    return app


class RunningFront:
    """A uvicorn server running :func:`create_app` in a background thread."""

    def __init__(self, server, thread: threading.Thread) -> None:
        self.server, self.thread = server, thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start_front(grpc_url: str, host: str = "127.0.0.1", port: int = 9000,
                model_name: str | None = None) -> RunningFront:
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
