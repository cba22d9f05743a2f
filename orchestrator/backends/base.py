"""The engine interface every layer above depends on.

An engine generates a batch of continuations from token prefixes. The Lookahead Reasoning loop, the
verifiers and the serving glue only see :class:`Engine`; each backend (portable PyTorch/transformers,
TensorRT-LLM, Triton, OpenAI-compatible HTTP) lives in its own module and imports its heavy dependency
lazily.

Validation errors are raised as :class:`ValueError` (pydantic's ``ValidationError`` is one) and name the
offending field.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

FinishReason = Literal["stop", "eos", "length", "cancelled"]


class SamplingParams(BaseModel):
    """How the next token is chosen.

    ``temperature == 0`` means greedy (argmax). Otherwise logits are processed by transformers'
    ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (in that order, as
    ``generate`` does) and sampled with a per-request ``torch.Generator`` seeded by ``seed``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy; > 0 samples; at most 2 (OpenAI's range)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus mass in (0, 1]")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens; 0 disables")
    seed: int | None = Field(None, ge=0, description="per-request RNG seed; None = nondeterministic")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


#: Token-level speculative decoding methods (``SpecDecodeConfig.method``).
SdMethod = Literal["none", "ngram", "draft_model", "medusa", "eagle3"]


class SpecDecodeConfig(BaseModel):
    """Token-level speculative decoding inside one generation.

    ``ngram``: prompt lookup as vLLM's ``ngram`` method: match the last ``prompt_lookup_max`` ..
    ``prompt_lookup_min`` tokens against earlier context and propose the ``num_speculative_tokens``
    tokens that followed the most recent match. ``draft_model``: a second engine proposes
    ``num_speculative_tokens`` tokens. ``medusa``: the engine's Medusa heads propose one token each from the
    target's last hidden state, with no extra forward (:mod:`.medusa`; at most as many as the engine has
    heads). ``eagle3``: the engine's EAGLE-3 head proposes ``num_speculative_tokens`` tokens autoregressively
    from the target's low/middle/high-layer features of the same forwards (:mod:`.eagle`). Proposals are
    verified in one target forward; greedy output is identical to plain decoding and sampled output follows the
    target distribution (speculative rejection sampling, Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

    ``schedule`` sets how many of the ``num_speculative_tokens`` slots a sequence uses at each step, as
    transformers' ``num_assistant_tokens_schedule``: ``constant`` always all of them; ``heuristic`` (default)
    starts at all of them, adds 2 after a step whose proposals were all accepted and drops 1 (to no fewer than
    1) after one with a rejection. A forward's width is its widest row's, so proposals that keep failing (the
    n-gram proposer on text that does not repeat) would otherwise widen every forward for nothing. The schedule
    depends only on past acceptances, so outputs stay exact (greedy) or target-distributed (sampling).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: SdMethod = "none"
    num_speculative_tokens: int = Field(0, ge=0, le=64)
    schedule: Literal["heuristic", "constant"] = "heuristic"
    prompt_lookup_max: int = Field(2, ge=1)
    prompt_lookup_min: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SpecDecodeConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must be <= prompt_lookup_max")
        if self.method != "none" and self.num_speculative_tokens == 0:
            raise ValueError(f"num_speculative_tokens must be > 0 for method {self.method!r}")
        return self

    @property
    def enabled(self) -> bool:
        return self.method != "none" and self.num_speculative_tokens > 0


NO_SPEC = SpecDecodeConfig()
GREEDY = SamplingParams()


@dataclass(frozen=True)
class GenerationRequest:
    """One continuation to generate.

    Attributes:
        prompt_ids: prefix token ids (non-empty, each in ``[0, vocab_size)``).
        max_new_tokens: cap on generated tokens (> 0; prompt + this must fit the context window).
        stop: stop strings matched on decoded text; generation ends with the token that completes a stop
            string, and that token stays in the output (so a step is a span of whole tokens).
        sampling: see :class:`SamplingParams`.
        spec: token-level speculative decoding, see :class:`SpecDecodeConfig`.
        request_id: optional caller id (used for cancellation and logs).
        stop_count: finish at the ``stop_count``-th completed stop string instead of the first (several
            reasoning steps in one call: the draft's chain of a cycle); each completion's offset is returned in
            ``GenerationResult.stop_offsets``. Backends that cannot do it reject values above 1.
        max_tokens_per_stop: with ``stop_count``, finish (``length``) when this many tokens follow the last
            completed stop string without another (a step's ``max_step_tokens``); None: no such cap.
        prediction: token ids the continuation is expected to start with (OpenAI's "Predicted Outputs", a
            ``prediction`` of known content): the in-process engines propose them as token-level SD proposals, in
            place of the ``spec`` method's, while the output agrees with them; after a difference the ``spec`` method
            proposes, or without one the 2 prediction tokens that follow where the output rejoins the prediction
            (prompt lookup within it). The output is what it would be without them (greedy: identical, on llama.cpp
            within its batch variance; sampled: target-distributed, speculative rejection sampling with one-hot
            ``q``); only the number of forwards changes, and the proposals count as drafted / accepted tokens. A
            Lookahead Reasoning branch predicts the drafted step at its depth. Backends that cannot use it ignore it.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = GREEDY
    spec: SpecDecodeConfig = NO_SPEC
    request_id: str | None = None
    stop_count: int = 1
    max_tokens_per_stop: int | None = None
    prediction: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Normalise lists to tuples so requests are hashable and immutable.
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "prediction", tuple(int(t) for t in self.prediction))


@dataclass
class GenerationCounters:
    """Work done for one request (all counts in tokens unless named otherwise).

    ``forward_passes`` counts decoding forwards (each yields at least one token; prefill forwards, which may
    serve several requests at once, are not counted); ``prefill_tokens_computed`` / ``prefill_tokens_cached``
    split the prompt between KV computed for this request and KV served from the prefix cache;
    ``drafted_tokens`` / ``accepted_tokens`` are token-level speculative decoding proposals and acceptances;
    ``forward_positions`` sums the new positions each decoding forward computed for this request (its row's
    padded width: 1 plus the most proposals of any row in that forward);
    ``drafted_by_position`` / ``accepted_by_position`` split them by position in a forward's proposals (index 0:
    the first proposed token), as vLLM's ``num_accepted_tokens_per_pos``: position ``i`` is accepted only if the
    ones before it were, so ``accepted[i] / drafted[i]`` falls with ``i``;
    ``seconds`` is wall time from submission to completion, ``queue_seconds`` from submission to admission into
    the running batch (0 where a backend does not report it).
    """

    forward_passes: int = 0
    prefill_tokens_computed: int = 0
    prefill_tokens_cached: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    forward_positions: int = 0
    seconds: float = 0.0
    queue_seconds: float = 0.0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)

    def add(self, other: GenerationCounters) -> None:
        """Add ``other``'s counts (per-position lists element by element)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, add_counts(getattr(self, name), getattr(other, name)))

    def count_proposals(self, drafted: int, accepted: int) -> None:
        """Count one forward's ``drafted`` proposals of which the first ``accepted`` reached the output."""
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if drafted:
            self.drafted_by_position = add_by_position(self.drafted_by_position, [1] * drafted)
        if accepted:
            self.accepted_by_position = add_by_position(self.accepted_by_position, [1] * accepted)


def add_by_position(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum of two per-position count lists of any lengths."""
    if len(a) < len(b):
        a, b = b, a
    return [x + (b[i] if i < len(b) else 0) for i, x in enumerate(a)]


def add_counts(a, b):
    """``a + b`` for counts and times; element-wise (:func:`add_by_position`) for per-position lists."""
    return add_by_position(a, b) if isinstance(a, list) else a + b


@dataclass
class GenerationResult:
    """What one request produced.

    Attributes:
        token_ids: new tokens only (the prompt is not repeated).
        text: decoded ``token_ids``.
        finish_reason: ``stop`` (a stop string completed), ``eos`` (an EOS id was generated; it is kept
            in ``token_ids``), ``length`` (``max_new_tokens`` reached) or ``cancelled``.
        counters: :class:`GenerationCounters`.
        token_probs: ``[len(token_ids), vocab]`` float32 distributions the tokens were sampled from; only
            filled by the portable engine for internal draft-model proposals (``submit(..., collect_probs=True)``).
        stop_offsets: for each completed stop string, the number of new tokens up to and including the token
            that completed it (ascending; see ``GenerationRequest.stop_count``).
    """

    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    counters: GenerationCounters = field(default_factory=GenerationCounters)
    token_probs: object | None = None
    stop_offsets: list[int] = field(default_factory=list)


def check_stop_fields(req: GenerationRequest, multi_stop: bool) -> None:
    """Validate ``stop_count`` / ``max_tokens_per_stop`` (``multi_stop``: the backend supports ``stop_count > 1``).

    Raises:
        ValueError: naming the field.
    """
    if not isinstance(req.stop_count, int) or req.stop_count < 1:
        raise ValueError(f"stop_count: must be an integer >= 1, got {req.stop_count!r}")
    if req.stop_count > 1 and not multi_stop:
        raise ValueError("stop_count: this backend stops at the first stop string only")
    if req.stop_count > 1 and not req.stop:
        raise ValueError("stop_count: needs stop strings")
    if req.max_tokens_per_stop is not None and (not isinstance(req.max_tokens_per_stop, int)
                                                or req.max_tokens_per_stop < 1):
        raise ValueError(f"max_tokens_per_stop: must be an integer >= 1, got {req.max_tokens_per_stop!r}")


class RequestGroup:
    """Requests started together whose results arrive one by one (branch-aware verification: the LR loop judges
    branch ``j`` as soon as it is done and cancels the deeper branches once one is rejected).

    Attributes:
        results: one asyncio future per request, in request order, resolving to its
            :class:`GenerationResult`; a cancelled request resolves with finish reason ``cancelled`` (and, where
            the backend keeps them, the counters of the work it did), never with ``CancelledError``.
    """

    def __init__(self, results: list[asyncio.Future[GenerationResult]], cancel) -> None:
        self.results = results
        self._cancel = cancel

    def cancel(self, indices: Sequence[int]) -> None:
        """Stop the requests at ``indices`` (finished ones are unaffected)."""
        indices = [i for i in indices if not self.results[i].done()]
        if indices:
            self._cancel(indices)


def start_requests(engine: Engine, requests: Sequence[GenerationRequest]) -> RequestGroup:
    """Start ``requests`` on ``engine`` as a :class:`RequestGroup` (call from a running event loop).

    Backends with their own ``start`` (the portable engine: one group in one in-flight batch, per-request results
    and cancellation) use it. For the others the group is ONE ``agenerate`` call, as without a group (over BLS one
    call is one round trip; a call per request would multiply them and the calls in flight): every result arrives
    when the call ends, and cancelling takes effect only once every unfinished request is cancelled.

    Raises:
        ValueError: an invalid request (from the backend's own ``start``; otherwise from the futures).
    """
    start = getattr(engine, "start", None)
    if callable(start):
        return start(requests)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(engine.agenerate(list(requests)))
    futures = [loop.create_future() for _ in requests]

    def deliver(t: asyncio.Task) -> None:
        for i, f in enumerate(futures):
            if f.done():
                continue
            if t.cancelled():
                f.set_result(GenerationResult([], "", "cancelled"))
            elif t.exception() is not None:
                f.set_exception(t.exception())
            else:
                f.set_result(t.result()[i])

    task.add_done_callback(deliver)

    def cancel(indices: Sequence[int]) -> None:
        if set(indices) >= {i for i, f in enumerate(futures) if not f.done()}:
            task.cancel()

    return RequestGroup(futures, cancel)


@runtime_checkable
class Engine(Protocol):
    """A batch text-generation engine with tokenizer access.

    ``agenerate`` is the primary call (asyncio); ``generate`` is its blocking twin. Requests of one call
    may be batched together and with other callers' requests (in-flight batching); results come back in
    request order. Invalid requests raise ``ValueError`` naming the field before any work starts.
    """

    name: str

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    @property
    def context_length(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]: ...

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...

    def close(self) -> None: ...


class FutureEngineMixin:
    """``generate`` / ``agenerate`` for backends built on ``submit(requests) -> concurrent.futures.Future``.

    Cancelling the task awaiting ``agenerate`` calls ``cancel(future)`` (override it to release engine state).
    """

    def cancel(self, fut) -> None:
        fut.cancel()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Blocking: submit and wait."""
        return self.submit(requests).result()  # type: ignore[attr-defined]

    async def agenerate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Asyncio (any loop): submit and await."""
        fut = self.submit(requests)  # type: ignore[attr-defined]
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self.cancel(fut)
            raise


class LoopThreadEngine(FutureEngineMixin):
    """Base of backends whose calls are coroutines (an HTTP client, TensorRT-LLM's ``generate_async``): a private
    event loop in a daemon thread lets blocking callers and any asyncio loop share them.

    A subclass defines ``async _one(req) -> GenerationResult`` (counting ``self._inflight`` while a call is out),
    calls :meth:`_start_loop` in its constructor and :meth:`_stop_loop` when it closes; it needs ``self._vocab``
    and ``self._context`` (:class:`~.tokenizer.TokenizerAccess`) for :meth:`validate`.
    """

    _inflight = 0
    _closed = False

    def _start_loop(self, name: str) -> None:
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-{id(self):x}", daemon=True)
        self._thread.start()

    def _run(self, coro):
        """Run ``coro`` on the private loop: a ``concurrent.futures.Future`` of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    @property
    def active_sequences(self) -> int:
        """Calls in flight from this engine."""
        return self._inflight

    def validate(self, req: GenerationRequest) -> None:
        """Raise ``ValueError`` naming the field if ``req`` cannot be served (:func:`validate_request`)."""
        validate_request(req, self._vocab, self._context)  # type: ignore[attr-defined]

    async def _many(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))  # type: ignore[attr-defined]

    def submit(self, requests: Sequence[GenerationRequest]):
        """Validate, then start the calls; the future resolves to the results in request order.

        Raises:
            ValueError: an invalid request (nothing is sent then); RuntimeError if the engine is closed.
        """
        requests = list(requests)
        for r in requests:
            self.validate(r)
        if self._closed:
            raise RuntimeError("engine is closed")
        return self._run(self._many(requests))


def check_gpu_mode(static_cache: bool, cuda_graphs: bool, device: str, compile: bool) -> None:
    """The portable engine's GPU-mode rules, shared by its config and by profiles (which check them at load time).

    Raises:
        ValueError: naming the field: ``cuda_graphs`` without ``static_cache`` or off a cuda device (graphs replay
        fixed buffers on a GPU; PyTorch "CUDA Graphs" docs), or ``compile`` together with ``cuda_graphs``.
    """
    if not cuda_graphs:
        return
    if not static_cache:
        raise ValueError("cuda_graphs: needs static_cache")
    if not device.startswith("cuda"):
        raise ValueError(f"cuda_graphs: needs a cuda device (device is {device!r})")
    if compile:
        raise ValueError("compile: choose one of compile and cuda_graphs")


def validate_request(req: GenerationRequest, vocab_size: int, context_length: int, multi_stop: bool = False) -> None:
    """Raise ``ValueError`` naming the field if ``req`` cannot be served: the rules every backend applies
    (``multi_stop``: the backend supports ``stop_count > 1``, see :func:`check_stop_fields`)."""
    if not isinstance(req, GenerationRequest):
        raise ValueError(f"request: expected GenerationRequest, got {type(req).__name__}")
    if len(req.prompt_ids) == 0:
        raise ValueError("prompt_ids: empty prompt")
    for name in ("prompt_ids", "prediction"):
        bad = [t for t in getattr(req, name) if t < 0 or t >= vocab_size]
        if bad:
            raise ValueError(f"{name}: token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    if req.max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens: must be > 0, got {req.max_new_tokens}")
    if len(req.prompt_ids) + req.max_new_tokens > context_length:
        raise ValueError(
            f"max_new_tokens: prompt ({len(req.prompt_ids)} tokens) + max_new_tokens ({req.max_new_tokens})"
            f" exceeds the context window of {context_length} tokens"
        )
    if any((not isinstance(s, str)) or s == "" for s in req.stop):
        raise ValueError("stop: stop strings must be non-empty strings")
    check_stop_fields(req, multi_stop=multi_stop)


def first_stop_end(token_ids: Sequence[int], stop: Sequence[str], decode) -> int | None:
    """Smallest ``k`` such that ``decode(token_ids[:k])`` contains a stop string, or ``None``.

    ``decode`` maps ids to text. Containment is monotone in ``k`` for stop strings of whole characters, so the
    boundary is found by bisection (O(log n) decodes).
    """
    if not stop or not token_ids:
        return None
    ids = list(token_ids)

    def hit(k: int) -> bool:
        text = decode(ids[:k])
        return any(s in text for s in stop)

    if not hit(len(ids)):
        return None
    return bisect.bisect_left(range(len(ids) + 1), True, key=hit)


def finish_generation(token_ids: Sequence[int], *, max_new_tokens: int, stop: Sequence[str],
                      eos_token_ids: frozenset[int], decode,
                      server_finish: str | None = None) -> tuple[list[int], str]:
    """Apply the engine contract to a server's raw generated ids.

    Returns ``(ids, finish_reason)``: ids cut after the first EOS (kept; ``"eos"``), after the token that first
    completes a stop string (kept; ``"stop"``), or at ``max_new_tokens`` (``"length"``); otherwise the ids
    unchanged with ``"length"`` if the server said so, else ``"stop"`` (a server-side stop we cannot see, such
    as a stop token id configured on the server).
    """
    ids = list(token_ids)[:max_new_tokens]
    eos_at = next((i for i, t in enumerate(ids) if t in eos_token_ids), None)
    stop_end = first_stop_end(ids if eos_at is None else ids[:eos_at + 1], stop, decode)
    if stop_end is not None and (eos_at is None or stop_end <= eos_at):
        return ids[:stop_end], "stop"
    if eos_at is not None:
        return ids[:eos_at + 1], "eos"
    if len(ids) >= max_new_tokens:
        return ids, "length"
    return ids, "length" if server_finish == "length" else "stop"
