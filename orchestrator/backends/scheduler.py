"""The in-flight batch scheduler shared by the in-process backends (portable PyTorch, llama.cpp).

What every such backend does the same way lives here, once: request groups and their futures (the whole group,
and each request on its own for branch-aware callers), cancellation, the scheduler thread that admits queued
sequences between decoding steps, the token-level SD proposals of each row (:mod:`.spec_decode`), the
verification of a step's logits (greedy rows from one argmax, sampled rows by speculative rejection sampling),
stop strings, EOS, ``max_new_tokens`` and the completion of a request.

A backend subclasses :class:`BatchScheduler` and supplies the model side, its abstract methods: ``validate`` (refuse
a request it cannot serve), ``_setup`` (load the model in the scheduler thread), ``_admit`` (prefill new sequences),
``_step`` (one decoding forward for the running batch, then :meth:`BatchScheduler._commit`), ``_release`` (a finished
or cancelled row leaves the batch), ``_reset_batch`` (after a failed step) and ``reset_prefix_cache``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from .base import FutureEngineMixin, GenerationCounters, GenerationRequest, GenerationResult, RequestGroup
from .spec_decode import ProposalRow, Proposer, greedy_accepted, make_warpers, verify

log = logging.getLogger(__name__)

#: Proposals taken from a request's prediction after the output rejoins it (:meth:`BatchScheduler._predicted`).
#: Replayed on the demo trio's branches that differ from their drafted step (385 branches, 20 problems; their
#: first difference is at the first token for half of them): 2 proposals cut their decoding forwards from 14.1 to
#: 9.4 with 21 positions fed, the whole rest of the prediction to 7.5 forwards with 45 positions, and on llama.cpp,
#: where a fed position costs about 0.2 of a one-token decode, those extra positions made the target call dearer
#: (2.96 `ar` steps per cycle against 2.54 without rejoining; benchmarks/journal.md#2026-12-08-predicted-branches).
REJOIN_TOKENS = 2


@dataclass
class _Group:
    """The requests of one submit() call: ``future`` resolves when all are done, ``items[i]`` when request
    ``i`` is (cancelled requests resolve with their partial result, finish reason ``cancelled``)."""

    future: Future
    results: list[GenerationResult | None]
    remaining: int
    items: list[Future] = field(default_factory=list)
    seqs: list[Seq] = field(default_factory=list)
    cancelled: bool = False


@dataclass
class Seq:
    """One request's row while it is queued or running.

    ``tokens`` is prompt + generated; once admitted, the backend holds KV for ``tokens[:-1]`` (the last token is
    fed by the next decoding step). ``features`` (portable engine: the target's features at the last committed
    positions, for Medusa / EAGLE-3) and ``kv_seq`` (llama.cpp: the KV sequence id of the row) are backend state.
    """

    req: GenerationRequest
    group: _Group
    index: int
    tokens: list[int]
    n_prompt: int
    t_submit: float
    counters: GenerationCounters = field(default_factory=GenerationCounters)
    warpers: object = None
    generator: torch.Generator | None = None
    stop_chars: int = 0  # longest stop string, characters
    finish: str | None = None
    cancelled: bool = False
    stop_offsets: list[int] = field(default_factory=list)  # generated-token counts at each completed stop
    spec_k: int = 0  # speculative slots this sequence uses next (SpecDecodeConfig.schedule)
    collect_probs: bool = False
    probs: list = field(default_factory=list)
    features: torch.Tensor | None = None  # [n, F] at the last n committed positions (methods reading features)
    kv_seq: int = -1
    from_prediction: bool = False  # this step's proposals are the request's prediction (not its spec method)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    @property
    def stopped(self) -> bool:
        """Cancelled, alone or with its whole group."""
        return self.cancelled or self.group.cancelled


class BatchScheduler(FutureEngineMixin, ABC):
    """In-flight batching over a backend's model (see the module docstring).

    The subclass contract: the abstract methods below, and the attributes annotated here: ``name`` (the runtime, as
    :data:`.drafters.DRAFTERS` knows it), and, set in ``_setup``, ``self.tokenizer`` with the
    :class:`~.tokenizer.TokenizerAccess` limits (``_eos``, ``_context``, ``_vocab``, and ``decode``) and ``self._pad``
    (a padding id). ``_proposers`` comes from :meth:`_start_scheduler`; ``_setup`` may replace it with more proposers
    (:func:`.drafters.make_proposers`) once heads that read the model's features are loaded. The scheduler thread
    calls ``_setup``, then ``_admit``, ``_step``, ``_release`` and ``_reset_batch`` under ``_work_lock``; callers'
    threads call :meth:`validate` and :meth:`reset_prefix_cache`.
    """

    supports_stop_count = True  # GenerationRequest.stop_count > 1: several steps in one call
    max_batch_size = 64
    name: str
    _pad: int
    _eos: frozenset[int]
    _context: int
    _vocab: int
    decode: Callable[[Sequence[int]], str]  # TokenizerAccess.decode (annotated only: a method here would shadow it)

    # -- the model side (what a backend implements) ----------------------------------------------------------
    @abstractmethod
    def validate(self, req: GenerationRequest) -> None:
        """Raise ``ValueError`` naming the field (``spec.method``, ``prompt_ids``, ...) if ``req`` cannot be served;
        :meth:`submit` calls it for every request of a call before queueing any (callers' threads)."""

    @abstractmethod
    def _setup(self, model) -> None:
        """Load the model (``model``: one built already, or None) and build the backend's state, in the scheduler
        thread before it serves: set the attributes of the class docstring. An exception here is raised by
        :meth:`_start_scheduler` in the constructor."""

    @abstractmethod
    def _admit(self, new: list[Seq]) -> None:
        """Prefill ``new`` (queued, not cancelled) sequences, KV for ``tokens[:-1]`` of each, and append them to
        ``self._running``; set their ``counters`` (queue and prefill). An exception fails the groups of ``new`` and
        of the running rows, then :meth:`_reset_batch`."""

    @abstractmethod
    def _step(self) -> None:
        """One decoding forward for every row of ``self._running``: each row's last token plus its proposals
        (:meth:`_proposals`), verified by :meth:`_commit` (padded rows) or :meth:`_commit_flat` (rows one after
        another); rows that finished leave through :meth:`_release`."""

    @abstractmethod
    def _release(self, s: Seq) -> None:
        """Take the finished or cancelled (``s.finish == "cancelled"``) row ``s`` out of ``self._running`` and the
        backend's batch state (keeping its KV for a later prefix where the backend caches it, never a cancelled
        row's), then :meth:`_complete` it."""

    @abstractmethod
    def _reset_batch(self) -> None:
        """After a failed :meth:`_admit` or :meth:`_step` (``self._running`` already emptied, its groups failed):
        drop the running rows' state so the next step starts from an empty batch; cached prefixes may stay."""

    @abstractmethod
    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix (KV kept for later requests), safely against the scheduler thread (callers'
        threads call it, e.g. between benchmark runs)."""

    def _shutdown(self) -> None:
        """Free the backend's native resources (runs in the scheduler thread after the last step); optional."""

    def _start_scheduler(self, model, proposers: dict[str, Proposer]) -> None:
        """Start the scheduler thread, which calls ``_setup(model)`` first; errors while loading are raised here."""
        self._proposers = dict(proposers)
        self._running: list[Seq] = []
        self._pending: list[Seq] = []
        self._cv = threading.Condition()
        self._work_lock = threading.Lock()  # held while the scheduler works on the batch (admission, a step)
        self._closed = False
        self.stats = GenerationCounters()  # totals over the engine's life
        # With record_steps: (rows, new positions per row, seconds) per decode step, and per prefill forward.
        self.step_seconds: list[tuple[int, int, float]] = []
        self.prefill_seconds: list[tuple[int, int, float]] = []
        self.record_steps = False
        ready: Future = Future()
        self._thread = threading.Thread(target=self._loop, args=(model, ready), name=f"engine-{id(self):x}",
                                        daemon=True)
        self._thread.start()
        ready.result()

    # -- public generation API -------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest], collect_probs: bool = False) -> Future:
        """Queue ``requests``; the returned future resolves to their results in order.

        ``collect_probs`` (internal, for draft-model proposals): sampled requests return the distribution
        each token was drawn from in ``GenerationResult.token_probs`` and get no speculation of their own.

        Raises:
            ValueError: an invalid request (nothing is queued then); RuntimeError if the engine is closed.
        """
        requests = list(requests)
        for req in requests:
            self.validate(req)
        fut: Future = Future()
        group = _Group(fut, [None] * len(requests), len(requests), [Future() for _ in requests])
        if not requests:
            fut.set_result([])
            return fut
        now = time.perf_counter()
        seqs = [Seq(req, group, i, list(req.prompt_ids), len(req.prompt_ids), now) for i, req in enumerate(requests)]
        group.seqs = seqs
        for s in seqs:
            s.stop_chars = max((len(x) for x in s.req.stop), default=0)
            s.spec_k = s.req.spec.num_speculative_tokens
            s.collect_probs = collect_probs and not s.req.sampling.greedy
            s.warpers = make_warpers(s.req.sampling)
            if not s.req.sampling.greedy:
                s.generator = torch.Generator(device="cpu")
                if s.req.sampling.seed is not None:
                    s.generator.manual_seed(s.req.sampling.seed)
                else:
                    s.generator.seed()
        with self._cv:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._pending.extend(seqs)
            self._cv.notify()
        fut.group = group  # type: ignore[attr-defined]
        return fut

    def cancel(self, fut: Future, indices: Sequence[int] | None = None) -> None:
        """Stop the requests of a submitted group (only those at ``indices``, when given); their rows and KV are
        released at the next step and each resolves with its partial result (finish reason ``cancelled``)."""
        group = getattr(fut, "group", None)
        if group is not None:
            with self._cv:
                if indices is None:
                    group.cancelled = True
                else:
                    for i in indices:
                        group.seqs[i].cancelled = True
                self._cv.notify()

    def start(self, requests: Sequence[GenerationRequest]) -> RequestGroup:
        """Submit ``requests`` from a running event loop; each request's result can be awaited on its own and
        any of them cancelled (see :class:`~.base.RequestGroup`).

        Raises:
            ValueError: an invalid request (nothing is queued); RuntimeError if the engine is closed.
        """
        loop = asyncio.get_running_loop()
        fut = self.submit(requests)
        items = [asyncio.wrap_future(f, loop=loop) for f in fut.group.items] if requests else []
        return RequestGroup(items, lambda idx: self.cancel(fut, idx))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    @property
    def active_sequences(self) -> int:
        """Rows in the running batch plus queued sequences."""
        return len(self._running) + len(self._pending)

    # -- scheduler -------------------------------------------------------------------------------------
    def _loop(self, model, ready: Future) -> None:
        try:
            self._setup(model)
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor
            ready.set_exception(exc)
            return
        ready.set_result(None)
        with torch.inference_mode():
            self._serve()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._pending and not self._running:
                    self._cv.wait()
                if self._closed:
                    break
                room = self.max_batch_size - len(self._running)
                new, self._pending = self._pending[:room], self._pending[room:]
            with self._work_lock:
                try:
                    self._drop_cancelled()
                    for s in [s for s in new if s.stopped]:
                        s.finish = "cancelled"
                        self._complete(s)
                    new = [s for s in new if not s.stopped]
                    if new:
                        self._admit(new)
                    if self._running:
                        self._step()
                except Exception as exc:  # keep serving: fail only the affected groups
                    log.exception("engine step failed")
                    groups = {id(s.group): s.group for s in self._running + new}
                    for g in groups.values():
                        _fail(g, exc)
                    self._running = []
                    self._reset_batch()
        with self._cv:
            for s in self._pending + self._running:
                _fail(s.group, RuntimeError("engine closed"))
        self._shutdown()

    def _drop_cancelled(self) -> None:
        for s in [s for s in self._running if s.stopped]:
            s.finish = "cancelled"
            self._release(s)
        with self._cv:
            gone = [s for s in self._pending if s.stopped]
            self._pending = [s for s in self._pending if not s.stopped]
        for s in gone:
            s.finish = "cancelled"
            self._complete(s)

    # -- decoding --------------------------------------------------------------------------------------
    def _proposals(self) -> list[tuple[list[int], torch.Tensor | None]]:
        """``(tokens, draft probabilities or None)`` per running row: the rest of the row's prediction while it holds
        (:meth:`_predicted`), otherwise its proposer (by its ``spec.method``), asked once per step for the rows that
        use it (:mod:`.spec_decode`)."""
        props: list[tuple[list[int], torch.Tensor | None]] = [([], None)] * len(self._running)
        groups: dict[str, list[tuple[int, ProposalRow]]] = {}
        feature_cols = getattr(self, "_feature_cols", {})
        for r, s in enumerate(self._running):
            spec = s.req.spec
            s.from_prediction = False
            if not (s.req.prediction or spec.enabled) or s.collect_probs:
                continue  # the common plain row: no work per step
            room = self._room(s)
            predicted = self._predicted(s, room, rejoin=not spec.enabled)
            if predicted:
                s.from_prediction = True
                props[r] = (predicted, None)
                continue
            if not spec.enabled:
                continue
            room = min(room, s.spec_k)
            if room <= 0:
                continue
            sampling = s.req.sampling
            if spec.method == "draft_model" and not sampling.greedy:  # a seed per row, from the row's generator
                seed = int(torch.randint(0, 2**31 - 1, (), generator=s.generator))
                sampling = sampling.model_copy(update={"seed": seed})
            cols = feature_cols.get(spec.method)
            features = s.features[:, cols] if cols is not None and s.features is not None else None
            groups.setdefault(spec.method, []).append((r, ProposalRow(s.tokens, room, spec, sampling, features)))
        for method, rows in groups.items():
            for (r, _), prop in zip(rows, self._proposers[method].propose([row for _, row in rows]), strict=False):
                props[r] = (prop.tokens, prop.probs)
        return props

    def _room(self, s: Seq) -> int:
        """How many proposals row ``s`` can take this step: one token of its budget and of the context window is
        the step's own (the correction or bonus token)."""
        return min(s.req.max_new_tokens - (len(s.tokens) - s.n_prompt) - 1, self._context - len(s.tokens) - 1)

    @staticmethod
    def _predicted(s: Seq, room: int, rejoin: bool = True) -> list[int]:
        """Proposals from ``s``'s ``GenerationRequest.prediction``, at most ``room``: its rest while everything
        generated so far agrees with it; after a difference (with ``rejoin``, which the caller sets for rows without
        a ``spec`` method), the :data:`REJOIN_TOKENS` that follow the last place in the prediction where the
        generated text's last 3, 2 or 1 tokens occur (prompt lookup, as vLLM's ``ngram`` method, with the prediction
        as the text searched: a target that words a drafted step differently often rejoins it a token later).
        Empty when nothing matches."""
        pred = s.req.prediction
        if room <= 0 or not pred:
            return []
        gen = s.tokens[s.n_prompt:]
        n = len(gen)
        if n < len(pred) and list(pred[:n]) == gen:
            return list(pred[n:n + room])
        if not rejoin:
            return []
        for width in (3, 2, 1):
            if n < width:
                continue
            tail = gen[-width:]
            for j in range(len(pred) - width - 1, -1, -1):
                if list(pred[j:j + width]) == tail:
                    return list(pred[j + width:j + width + min(room, REJOIN_TOKENS)])
        return []

    def _step_inputs(self, props: list[tuple[list[int], torch.Tensor | None]], width: int):
        """``(ids, real, pos)`` of one decoding step, each ``[rows, width]``: row ``r`` feeds its last token and its
        proposals (padded with ``self._pad``), ``real`` marks the fed slots and ``pos`` holds their positions."""
        n_props = torch.tensor([len(p) for p, _ in props])
        ids = torch.tensor([[s.tokens[-1]] + p + [self._pad] * (width - 1 - len(p))
                            for s, (p, _) in zip(self._running, props, strict=False)], dtype=torch.long)
        cols = torch.arange(width)
        real = cols[None] <= n_props[:, None]
        pos = torch.tensor([len(s.tokens) - 1 for s in self._running])[:, None] + cols[None]
        return ids, real, pos

    def _commit(self, props: list[tuple[list[int], torch.Tensor | None]], ids: torch.Tensor, real: torch.Tensor,
                logits: torch.Tensor) -> tuple[list[int], list[Seq]]:
        """Verify one decoding step's proposals and append each running row's new tokens (padded layout).

        Args:
            props: the step's proposals per row (:meth:`_proposals`).
            ids, real: ``[rows, width]`` fed ids and their validity (:meth:`_step_inputs`).
            logits: ``[rows, width, vocab]`` (any float dtype, any device): position ``j`` of row ``r`` predicts the
                token after ``ids[r, j]``.

        Greedy rows are verified together from one argmax (one device-to-host copy of ``[rows, width]`` ids);
        sampled rows, which need their own RNG and warpers, copy only their own logits (speculative rejection
        sampling, :func:`.spec_decode.verify`).

        Returns:
            ``(kept, finished)``: per row, how many fed slots keep valid KV (the fed last token plus the tokens
            appended after it, stops and EOS cutting the rest), and the rows that finished.
        """
        seqs = self._running
        b, width = ids.shape
        greedy = [r for r, s in enumerate(seqs) if s.req.sampling.greedy]
        best = logits.argmax(dim=-1).cpu() if greedy else None
        accepted = greedy_accepted(ids[:, 1:], real[:, 1:], best[:, :-1]).tolist() if greedy else [0] * b
        best = best.tolist() if greedy else None
        sampled = [r for r, s in enumerate(seqs) if not s.req.sampling.greedy]
        sampled_logits = dict(zip(sampled, logits[sampled].float().cpu(), strict=False)) if sampled else {}
        kept, finished = [0] * b, []
        for r, (s, (p, q)) in enumerate(zip(seqs, props, strict=False)):
            if s.req.sampling.greedy:
                acc = accepted[r]
                verdict = (acc, p[:acc] + [best[r][acc]], None)
            else:
                v = verify(p, sampled_logits[r][: len(p) + 1], s.req.sampling, s.warpers, s.generator, q)
                verdict = (v.accepted, v.tokens, v.probs)
            kept[r] = self._accept_row(s, len(p), *verdict, width, finished)
        return kept, finished

    def _commit_flat(self, props: list[tuple[list[int], torch.Tensor | None]], logits,
                     seqs: list[Seq] | None = None) -> tuple[list[int], list[Seq]]:
        """:meth:`_commit` for a step fed without padding (llama.cpp): row ``r`` fed its last token and its
        proposals at consecutive positions, rows one after another.

        Args:
            props: the step's proposals per row.
            logits: ``[sum over rows of 1 + proposals, vocab]`` float32 numpy array (or tensor), row ``r``'s
                positions at ``sum(1 + len(props[i][0]) for i < r)`` onwards.
            seqs: the rows (default: the running batch).
        Returns:
            as :meth:`_commit`; every row counts ``1 + max proposals`` forward positions, as there.

        The greedy check is one argmax over all positions and a Python comparison per proposal: no tensors are
        built for the common one-row, one-position step, whose Python cost is what separates our ``ar`` from
        llama.cpp's own loop.
        """
        seqs = self._running if seqs is None else seqs
        width = 1 + max(len(p) for p, _ in props)
        best = logits.argmax(-1).tolist() if any(s.req.sampling.greedy for s in seqs) else None
        kept, finished = [0] * len(seqs), []
        a = 0
        for r, (s, (p, q)) in enumerate(zip(seqs, props, strict=False)):
            k = len(p)
            if s.req.sampling.greedy:
                row = best[a:a + k + 1]
                acc = 0
                while acc < k and p[acc] == row[acc]:
                    acc += 1
                verdict = (acc, p[:acc] + [row[acc]], None)
            else:
                v = verify(p, torch.as_tensor(logits[a:a + k + 1]), s.req.sampling, s.warpers, s.generator, q)
                verdict = (v.accepted, v.tokens, v.probs)
            kept[r] = self._accept_row(s, k, *verdict, width, finished)
            a += k + 1
        return kept, finished

    def _accept_row(self, s: Seq, k: int, acc: int, tokens: list[int], probs, width: int, finished: list) -> int:
        """Book one row's verdict (``acc`` of its ``k`` proposals accepted, ``tokens`` to append, the sampled
        distributions ``probs``) and append the tokens; a row that finishes goes to ``finished``.

        Returns:
            how many fed slots keep valid KV (the fed last token plus the tokens appended after it).
        """
        if s.collect_probs:
            s.probs.append(probs[-1:])
        s.counters.forward_passes += 1
        s.counters.forward_positions += width
        if k and s.req.spec.schedule == "heuristic" and not s.from_prediction:  # num_assistant_tokens_schedule
            full = s.req.spec.num_speculative_tokens
            s.spec_k = min(full, s.spec_k + 2) if acc == k else max(1, s.spec_k - 1)
        kept = 0
        for tok in tokens:
            kept += 1
            if self._append(s, tok):
                finished.append(s)
                break
        # Only proposals that reach the output count as accepted (a stop, EOS or length cut drops the rest).
        s.counters.count_proposals(k, min(acc, kept))
        return kept

    def _append(self, s: Seq, tok: int) -> bool:
        """Append one token; returns True when the sequence is finished.

        Stop strings are looked for in the decoded tail only: the last tokens whose text is longer than the
        longest stop string (a stop completed by this token lies inside it), never the whole text again, and
        never before the last completed stop (``stop_count``).
        """
        s.tokens.append(tok)
        n_gen = len(s.tokens) - s.n_prompt
        if tok in self._eos:
            s.finish = "eos"
            return True
        since = n_gen - (s.stop_offsets[-1] if s.stop_offsets else 0)  # tokens since the last completed stop
        if s.stop_chars:
            n = min(since, s.stop_chars + 1)
            tail = self.decode(s.tokens[-n:])
            while len(tail) <= s.stop_chars and n < since:  # tokens that decode to little or nothing
                n = min(since, 2 * n)
                tail = self.decode(s.tokens[-n:])
            if any(x in tail for x in s.req.stop):
                s.stop_offsets.append(n_gen)
                if len(s.stop_offsets) >= s.req.stop_count:
                    s.finish = "stop"
                    return True
                since = 0
        cap = s.req.max_tokens_per_stop
        if (n_gen >= s.req.max_new_tokens or len(s.tokens) >= self._context
                or (cap is not None and since >= cap)):
            s.finish = "length"
            return True
        return False

    def _complete(self, s: Seq) -> None:
        gen = s.generated
        s.counters.seconds = time.perf_counter() - s.t_submit
        self.stats.prefill_tokens_cached += s.counters.prefill_tokens_cached
        self.stats.prefill_tokens_computed += s.counters.prefill_tokens_computed
        self.stats.drafted_tokens += s.counters.drafted_tokens
        self.stats.accepted_tokens += s.counters.accepted_tokens
        res = GenerationResult(list(gen), self.decode(gen), s.finish or "length", s.counters,
                               torch.cat(s.probs) if s.probs else None, list(s.stop_offsets))
        g = s.group
        g.results[s.index] = res
        g.remaining -= 1
        if not g.items[s.index].done():
            g.items[s.index].set_result(res)
        if g.remaining == 0 and not g.future.done():
            g.future.set_result(g.results)


def _fail(group: _Group, exc: Exception) -> None:
    """Fail a group's unfinished requests and the group itself."""
    for f in group.items + [group.future]:
        if not f.done():
            f.set_exception(exc)
