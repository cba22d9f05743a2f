"""Engine backend over an OpenAI-compatible ``/v1/completions`` server: trtllm-serve, vLLM, SGLang,
llama-cpp-python's ``llama_cpp.server``, or our own :mod:`lookahead_reasoning.serving.engine_http` (any of the three
roles).

The orchestrator works on token ids, so each request sends its prompt as a list of token ids and reads the
generated token ids back (vLLM's ``return_token_ids`` extension, our server, trtllm-serve's ``token_ids``
field); a server that returns only text has it re-encoded with the local tokenizer (approximate: a
re-encoding need not reproduce the ids the server sampled). The tokenizer, EOS ids, vocabulary and context
length come from a local checkpoint folder (``tokenizer``), so encode/decode/chat templates run client-side.

The engine contract is enforced client-side on the returned ids (:func:`finish_generation`): the first EOS
ends the output and stays in it; the first token that completes a stop string on the decoded text ends it
and stays in it (servers that match stop strings on token ids, like trtllm-serve, miss stops merged into
larger tokens such as ``".\\n\\n"``; they just run on until ``max_tokens`` and the client cuts); at most
``max_new_tokens`` tokens.

``llama_cpp.server`` (flavor ``llama-cpp``) lacks three things this backend needs, handled client-side:

* token-id prompts (its ``prompt`` is text only): the ids are decoded with special tokens kept and sent as text,
  which the server tokenizes again with special tokens recognised. Ids that are the tokenizer's own encoding of
  their text (everything the orchestrator builds from encoded prompts and re-encoded steps) come back the same;
  a non-canonical id sequence, or a user text holding a literal ``<|im_start|>``, does not. So a multi-call loop
  continues from the canonical ids of the text so far, not always from the ids the model wrote (a blank line
  written as two ``"\n"`` tokens comes back as one ``"\n\n"``), and its greedy output can differ from one
  completion;
* generated token ids (it returns text, and per-token logprobs only as text pieces): the text is re-encoded as
  above, and a ``"stop"`` finish (the server's only other reason besides ``"length"``, since no stop strings are
  sent) becomes the tokenizer's EOS id appended, as the engine contract keeps EOS in the output;
* stop strings kept in the output (it cuts the matched stop out of the text): ``stop`` is not sent, the server runs
  to ``max_tokens`` or EOS and the client cuts, so a stopped request costs its whole budget on that server.

Its sampling defaults are not neutral (``repeat_penalty`` 1.1, ``min_p`` 0.05, ``top_k`` 40), so every request sends
``repeat_penalty: 1``, ``min_p: 0`` and the request's ``top_k`` (0: off); ``seed`` is honoured. It serves one
request at a time (no in-flight batching), so concurrent calls queue on the server.

Token-level speculative decoding is a server setting (``--speculative-config`` in vLLM,
``speculative_config`` in trtllm-serve's ``--config`` YAML); ``GenerationRequest.spec`` is not sent.

HTTP runs on one background asyncio loop with one ``httpx.AsyncClient`` (connection pool), so the engine can
be awaited from any event loop or called from plain threads; concurrent requests become concurrent HTTP
calls and the server batches them in flight.
"""

from __future__ import annotations

import os
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import GenerationCounters, GenerationRequest, GenerationResult, LoopThreadEngine, finish_generation
from .tokenizer import TokenizerAccess

Flavor = Literal["vllm", "trtllm-serve", "sglang", "lookahead", "openai", "llama-cpp"]

#: Extension fields each server flavour accepts on /v1/completions besides the OpenAI ones
#: (model, prompt, max_tokens, temperature, top_p, stop, seed). trtllm-serve rejects unknown fields
#: (``extra="forbid"`` in tensorrt_llm/serve/openai_protocol.py); vLLM and our server accept these.
FLAVOR_EXTENSIONS: dict[str, frozenset[str]] = {
    "vllm": frozenset({"top_k", "return_token_ids", "include_stop_str_in_output", "skip_special_tokens"}),
    "lookahead": frozenset({"top_k", "return_token_ids", "include_stop_str_in_output", "skip_special_tokens"}),
    "trtllm-serve": frozenset({"top_k", "include_stop_str_in_output", "skip_special_tokens"}),
    "sglang": frozenset({"top_k", "no_stop_trim", "skip_special_tokens"}),
    "openai": frozenset(),
    "llama-cpp": frozenset({"top_k"}),
}

#: Fields a flavour's server defaults to non-neutral values, sent on every request (overridden by the request's own).
FLAVOR_NEUTRAL: dict[str, dict] = {"llama-cpp": {"top_k": 0, "repeat_penalty": 1.0, "min_p": 0.0}}

#: Flavours whose server takes text prompts only and returns text only (see the module docstring).
TEXT_ONLY_FLAVORS = frozenset({"llama-cpp"})


class OpenAIEngineConfig(BaseModel):
    """Settings of an :class:`OpenAIEngine` (validated; errors name the field).

    Attributes:
        url: server root, e.g. ``http://127.0.0.1:8001`` (a trailing ``/v1`` is accepted).
        tokenizer: local checkpoint folder with the served model's tokenizer and config.json.
        model: served model name; ``None`` = the first id listed by ``GET /v1/models``.
        flavor: which extension fields to send (see :data:`FLAVOR_EXTENSIONS`).
        timeout_s: per-HTTP-call timeout in seconds.
        max_connections: connection-pool size (bounds in-flight HTTP calls).
        api_key_env: environment variable holding a bearer token (unset or empty: no Authorization header).
        context_length: override of the server's context window in tokens (default: config.json's
            ``max_position_embeddings``).
        extra_body: extra JSON fields merged into every request body.
    """

    model_config = ConfigDict(extra="forbid")

    url: str = Field(..., min_length=1)
    tokenizer: str = Field(..., min_length=1)
    model: str | None = None
    flavor: Flavor = "vllm"
    timeout_s: float = Field(600.0, gt=0)
    max_connections: int = Field(256, ge=1)
    api_key_env: str = "OPENAI_API_KEY"
    context_length: int | None = Field(None, ge=2)
    extra_body: dict = Field(default_factory=dict)


# -- pure helpers (shared with the TensorRT-LLM backend) ---------------------------------------------------

def completion_body(req: GenerationRequest, model: str, flavor: str = "vllm", extra: dict | None = None,
                    prompt_text: str | None = None) -> dict:
    """JSON body of ``POST /v1/completions`` for one request.

    Greedy requests send ``temperature: 0`` (plus ``top_k: 1`` where ``top_k`` is accepted, since some servers
    treat ``temperature: 0`` only as a hint); sampled ones ``temperature``, ``top_p``, ``top_k`` (when > 0) and
    ``seed``. ``stop`` is sent so the server can stop early; the client still cuts (:func:`finish_generation`).
    Text-only flavours (:data:`TEXT_ONLY_FLAVORS`) get ``prompt_text`` as the prompt and no ``stop``.

    Raises:
        ValueError: ``prompt_text`` missing for a text-only flavour.
    """
    ext = FLAVOR_EXTENSIONS[flavor]
    s = req.sampling
    text_only = flavor in TEXT_ONLY_FLAVORS
    if text_only and prompt_text is None:
        raise ValueError(f"prompt: flavor {flavor!r} takes text prompts; pass prompt_text")
    body: dict = {"model": model, "prompt": prompt_text if text_only else list(req.prompt_ids),
                  "max_tokens": int(req.max_new_tokens), **FLAVOR_NEUTRAL.get(flavor, {})}
    if s.greedy:
        body["temperature"] = 0.0
        if "top_k" in ext:
            body["top_k"] = 1
    else:
        body["temperature"] = float(s.temperature)
        body["top_p"] = float(s.top_p)
        if s.top_k > 0 and "top_k" in ext:
            body["top_k"] = int(s.top_k)
    if s.seed is not None:
        body["seed"] = int(s.seed)
    if req.stop and not text_only:
        body["stop"] = list(req.stop)
        if "include_stop_str_in_output" in ext:
            body["include_stop_str_in_output"] = True
        if "no_stop_trim" in ext:
            body["no_stop_trim"] = True
    if "return_token_ids" in ext:
        body["return_token_ids"] = True
    if extra:
        body.update(extra)
    return body


def _http_error_message(resp) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        msg = str(err.get("message") or err.get("detail") or err)
        param = err.get("param")
        if param and not msg.startswith(f"{param}:"):
            msg = f"{param}: {msg}"
        return msg
    return str(err)


#: Request-body field -> engine-interface field, for naming the field in client-side errors.
_FIELD_TO_REQUEST = {"prompt": "prompt_ids", "max_tokens": "max_new_tokens"}


class OpenAIEngine(LoopThreadEngine, TokenizerAccess):
    """The Engine interface over an OpenAI-compatible completions server (see module docstring).

    Raises:
        ValueError: invalid config; OSError: the tokenizer folder cannot be read;
        ConnectionError: ``model`` is None and ``GET /v1/models`` fails.
    """

    name = "openai"

    def __init__(self, config: OpenAIEngineConfig) -> None:
        import httpx
        from transformers import AutoConfig

        self.config = config
        model_config = AutoConfig.from_pretrained(config.tokenizer)
        self._load_tokenizer(config.tokenizer, model_config)
        if config.context_length is not None:
            self._context = config.context_length
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self._eos_id = eos if eos in self._eos else min(self._eos, default=None)  # text-only flavours' EOS
        base = config.url.rstrip("/")
        self.base_url = base[:-3] if base.endswith("/v1") else base
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._start_loop("openai")
        limits = httpx.Limits(max_connections=config.max_connections,
                              max_keepalive_connections=config.max_connections)

        async def make_client():
            return httpx.AsyncClient(base_url=self.base_url, timeout=config.timeout_s, limits=limits,
                                     headers=self._headers)

        self._client = self._run(make_client()).result()
        self.model_name = config.model or self._first_model()

    # -- plumbing ---------------------------------------------------------------------------------------
    def _first_model(self) -> str:
        async def get():
            r = await self._client.get("/v1/models")
            r.raise_for_status()
            return r.json()

        try:
            data = self._run(get()).result(timeout=self.config.timeout_s)
        except Exception as exc:  # noqa: BLE001 - report what failed and where
            raise ConnectionError(f"url: GET {self.base_url}/v1/models failed: {exc}") from exc
        models = data.get("data") or []
        if not models:
            raise ConnectionError(f"url: {self.base_url}/v1/models lists no model; set `model`")
        return str(models[0]["id"])

    # -- generation -------------------------------------------------------------------------------------
    async def _one(self, req: GenerationRequest) -> GenerationResult:
        t0 = time.perf_counter()
        text_only = self.config.flavor in TEXT_ONLY_FLAVORS
        prompt_text = (self.tokenizer.decode(list(req.prompt_ids), skip_special_tokens=False,
                                             clean_up_tokenization_spaces=False) if text_only else None)
        body = completion_body(req, self.model_name, self.config.flavor, self.config.extra_body, prompt_text)
        self._inflight += 1
        try:
            resp = await self._client.post("/v1/completions", json=body)
        finally:
            self._inflight -= 1
        if resp.status_code == 400 or resp.status_code == 422:
            msg = _http_error_message(resp)
            field, sep, rest = msg.partition(":")
            if sep and field in _FIELD_TO_REQUEST:
                msg = f"{_FIELD_TO_REQUEST[field]}:{rest}"
            raise ValueError(msg)
        if resp.status_code >= 400:
            raise RuntimeError(f"{self.base_url}/v1/completions: HTTP {resp.status_code}: {_http_error_message(resp)}")
        data = resp.json()
        choice = data["choices"][0]
        raw = choice.get("token_ids")
        if raw is None:  # server without token ids: re-encode its text (approximate, see module docstring)
            raw = self.encode(choice.get("text") or "")
            if (text_only and choice.get("finish_reason") == "stop" and len(raw) < req.max_new_tokens
                    and self._eos_id is not None):
                raw.append(self._eos_id)  # no stop strings were sent: the server stopped at EOS
        ids, finish = finish_generation(raw, max_new_tokens=req.max_new_tokens, stop=req.stop,
                                        eos_token_ids=self._eos, decode=self.decode,
                                        server_finish=choice.get("finish_reason"))
        usage = data.get("usage") or {}
        cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        prompt_tokens = int(usage.get("prompt_tokens") or len(req.prompt_ids))
        counters = GenerationCounters(prefill_tokens_computed=max(0, prompt_tokens - cached),
                                      prefill_tokens_cached=cached, seconds=time.perf_counter() - t0)
        return GenerationResult(ids, self.decode(ids), finish, counters)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._client.aclose()).result(timeout=10)
        finally:
            self._stop_loop()


__all__ = ["FLAVOR_EXTENSIONS", "FLAVOR_NEUTRAL", "TEXT_ONLY_FLAVORS", "OpenAIEngine", "OpenAIEngineConfig",
           "completion_body"]
