"""The llama.cpp backend: a GGUF model on the CPU through ``llama-cpp-python``'s low-level batch API.

What it does per engine instance (one background scheduler thread, :class:`~.scheduler.BatchScheduler`, shared
with the portable engine: request groups, in-flight batching, cancellation, SD verification, stop strings):

- **One llama.cpp context, several sequences.** Every running request is a KV sequence id of one context
  whose KV cache is unified (``kv_unified``: all sequences share one pool of cells), so a decoding step is one
  ``llama_decode`` holding each row's last token and its SD proposals, each tagged with the row's sequence id
  and position (llama.cpp's ``llama_batch``; see its ``examples/batched`` and ``examples/parallel``).
- **Prefix sharing.** A new request copies the longest prefix any held sequence has in common with its prompt
  (``llama_memory_seq_cp``: with a unified cache the cells are shared, not recomputed or duplicated) and
  prefills only the rest. Several new prompts with a common uncached part (a Lookahead Reasoning cycle's
  branches: branch j is the context plus drafts 0..j-1) have it prefilled once, in the longest one's sequence.
  Finished requests keep their KV in spare sequence ids (``cache_slots``, least recently used evicted), so the
  next cycle's context is not prefilled again.
- **Predictions verified in the prefill.** A cycle's branch ``j`` predicts draft ``j``
  (``GenerationRequest.prediction``), which is exactly the text the longest branch's prompt holds after branch
  ``j``'s prompt: one ``llama_decode`` of the longest prompt's uncached part returns the logits that verify every
  branch's prediction, so a branch whose step the target writes as drafted is done in that call
  (:meth:`LlamaCppEngine._admit_predicted`). Before, the drafted text was prefilled, then fed again as each
  branch's first proposals. Without predictions a cycle's target call cost 3.51 `ar` steps, with them 2.71 (200 demo
  problems, benchmarks/journal.md#2026-12-08-predicted-branches).
- **Sampling in torch.** llama.cpp returns the logits of each fed position (``llama_get_logits``); greedy picks
  the argmax, sampling runs transformers' ``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` ->
  ``TopPLogitsWarper`` with a per-request seeded ``torch.Generator``, exactly as the portable engine does
  (:mod:`.spec_decode`), not llama.cpp's sampler chain. A request's ``temperature``, ``top_k`` and ``top_p``
  therefore mean the same on both backends.
- **Token-level SD**: n-gram prompt lookup, or a draft-model engine (any in-process engine with the same
  tokenizer, e.g. a portable draft), verified in the same ``llama_decode`` (:mod:`.spec_decode`). Medusa and
  EAGLE-3 need the target's hidden states and are refused (``spec.method``).

**Batch variance.** llama.cpp's CPU kernels are not batch-invariant: a position's logits depend on how many
tokens the ``llama_decode`` holds (a one-token call takes the matrix-vector path, a call of several tokens the
matrix-matrix path with its own activation quantisation). Greedy output is therefore identical to plain decoding
only up to the first position where the target's top-2 logit margin is smaller than that variance; the tests
check exactly that (``tests/test_llamacpp.py``). The ``exact`` judge's lossless guarantee holds on the portable
engine in float32 only.

The text side (tokenizer, chat template, EOS ids) is the Hugging Face tokenizer of the same model, as on the
other backends, so token ids agree with a portable draft or judge of the same family.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections import OrderedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .base import GenerationRequest, validate_request
from .drafters import check_method, make_proposers
from .scheduler import BatchScheduler, Seq
from .tokenizer import TokenizerAccess

log = logging.getLogger(__name__)

#: What to install when ``llama_cpp`` is missing.
LLAMACPP_HINT = ("runtime 'llamacpp' needs llama-cpp-python: pip install -e '.[llamacpp]' (builds llama.cpp from "
                 "source, about 8 minutes on 2 cores; see README 'llama.cpp backend')")

#: Sequence ids a llama.cpp context accepts (``LLAMA_MAX_SEQ`` in llama.cpp's ``src/llama-cparams.h``).
LLAMA_MAX_SEQ = 256


class LlamaCppEngineConfig(BaseModel):
    """Settings of a :class:`LlamaCppEngine` (validated; errors name the field)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., description="GGUF file")
    tokenizer: str = Field(..., description="Hugging Face folder with the same tokenizer (the GGUF dequantised by "
                                            "lookahead_reasoning.model_refs.resolve, or the original checkpoint)")
    n_threads: int = Field(2, ge=1, description="llama.cpp threads (decode and prefill)")
    n_gpu_layers: int = Field(0, ge=-1, description="layers offloaded to a GPU build of llama.cpp (-1: all); not run "
                                                    "in CI (no GPU build here)")
    kv_cells: int = Field(8192, ge=64, description="KV cells of the context, shared by all sequences (n_ctx)")
    context_length: int | None = Field(None, ge=16, description="longest sequence (default: the model's training "
                                                                "context, at most kv_cells)")
    n_batch: int = Field(512, ge=16, description="tokens per llama_decode call (longer prefills are chunked)")
    max_batch_size: int = Field(16, ge=1, description="running requests (sequence ids in the batch)")
    cache_slots: int = Field(16, ge=0, description="finished requests whose KV is kept for prefix reuse (LRU)")
    flash_attn: bool = Field(False, description="llama.cpp's flash attention (llama_context_params.flash_attn_type). "
                                                "Off, as in llama-cpp-python's Llama: on this project's CPUs it made a "
                                                "5-row decode cost 3.0 one-row calls instead of 1.85 "
                                                "(benchmarks/journal.md#2026-12-07-llamacpp-settings)")

    def model_post_init(self, __context) -> None:
        if self.max_batch_size + self.cache_slots > LLAMA_MAX_SEQ:
            raise ValueError(f"cache_slots: max_batch_size + cache_slots must be <= {LLAMA_MAX_SEQ} (llama.cpp's "
                             f"LLAMA_MAX_SEQ), got {self.max_batch_size + self.cache_slots}")


class LlamaCppEngine(BatchScheduler, TokenizerAccess):
    """Batch generation engine over a GGUF model through llama.cpp (see the module docstring).

    Args:
        config: :class:`LlamaCppEngineConfig`.
        draft_engine: an in-process engine with the same tokenizer for ``spec.method == "draft_model"``.

    Raises:
        ImportError: ``llama_cpp`` is not installed (:data:`LLAMACPP_HINT`). ValueError: the GGUF cannot be
        loaded (naming ``model``), or the tokenizer does not fit it (naming ``tokenizer``).
    """

    name = "llamacpp"

    def __init__(self, config: LlamaCppEngineConfig, draft_engine=None) -> None:
        try:
            import llama_cpp
        except ImportError as exc:
            raise ImportError(LLAMACPP_HINT) from exc
        self._L = llama_cpp
        self.config = config
        self.draft_engine = draft_engine
        self.max_batch_size = config.max_batch_size
        self._start_scheduler(None, make_proposers(self.name, draft_model=draft_engine))

    # -- set-up (scheduler thread) ---------------------------------------------------------------------
    def _setup(self, model) -> None:
        L, c = self._L, self.config
        try:
            from llama_cpp import _logger

            _logger.set_verbose(False)  # llama.cpp's own log goes through this logger: errors only
        except Exception:  # noqa: BLE001 - logging only
            pass
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = c.n_gpu_layers
        self.model = L.llama_model_load_from_file(c.model.encode(), mp)
        if not self.model:
            raise ValueError(f"model: llama.cpp could not load {c.model!r} (not a GGUF file it reads)")
        vocab = L.llama_model_get_vocab(self.model)
        n_vocab = int(L.llama_vocab_n_tokens(vocab))
        n_seq = c.max_batch_size + c.cache_slots
        cp = L.llama_context_default_params()
        cp.n_ctx = c.kv_cells
        cp.n_batch = cp.n_ubatch = c.n_batch
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = c.n_threads
        cp.kv_unified = True
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if c.flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise ValueError(f"kv_cells: llama.cpp could not create a context of {c.kv_cells} cells "
                             f"and {n_seq} sequences")
        self._mem = L.llama_get_memory(self.ctx)
        self._batch = L.llama_batch_init(c.n_batch, 0, 1)
        b = self._batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(c.n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(c.n_batch,))
        self._b_nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(c.n_batch,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(c.n_batch,))
        self._b_nseq[:] = 1
        self._logits_addr, self._logits_buf = None, None
        buf = (ctypes.c_char * 256)()
        L.llama_model_desc(self.model, buf, 256)
        self.model_desc = buf.value.decode(errors="replace")
        self._load_tokenizer(c.tokenizer)
        if self._vocab > n_vocab or len(self.tokenizer) > n_vocab:
            raise ValueError(f"tokenizer: {c.tokenizer} has {max(self._vocab, len(self.tokenizer))} tokens but the "
                             f"GGUF's vocabulary has {n_vocab}: tokenizer and model differ")
        self._vocab = n_vocab
        train_ctx = int(L.llama_model_n_ctx_train(self.model))
        self._context = min(c.context_length or train_ctx, c.kv_cells)
        self._pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._free = list(range(n_seq - 1, -1, -1))  # sequence ids without KV (pop() takes the lowest)
        self._cached: OrderedDict[int, np.ndarray] = OrderedDict()  # finished sequences' KV tokens, LRU first

    @property
    def dtype(self) -> str:
        """The GGUF's weight type, the last word of llama.cpp's model description (``llama 256M Q4_1`` -> ``Q4_1``)."""
        return self.model_desc.split()[-1] if self.model_desc else "unknown"

    # -- public API ------------------------------------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        """Raise ``ValueError`` naming the field if ``req`` cannot be served (:func:`.base.validate_request`,
        several stops per call, and the SD methods of :data:`.drafters.DRAFTERS` this runtime runs: n-gram, and
        draft-model SD with a draft engine)."""
        validate_request(req, self._vocab, self._context, multi_stop=True)
        check_method(self.name, req.spec, self._proposers)

    def reset_prefix_cache(self) -> None:
        """Drop the KV kept for finished requests."""
        with self._work_lock:  # not while the scheduler works on the batch
            while self._cached:
                self._drop_cached()

    # -- KV sequences ------------------------------------------------------------------------------------
    def _take_slot(self) -> int:
        if not self._free:
            if not self._cached:
                raise RuntimeError("max_batch_size: no free llama.cpp sequence id")
            self._drop_cached()
        return self._free.pop()

    def _drop_cached(self) -> None:
        """Evict the least recently used finished sequence."""
        seq, _ = self._cached.popitem(last=False)
        self._L.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._free.append(seq)

    def _holders(self, exclude: int) -> list[tuple[int, np.ndarray]]:
        """Sequence ids with KV and the tokens it is for (cached entries first, most recent first; then rows)."""
        out = [(q, t) for q, t in reversed(self._cached.items()) if q != exclude]
        out += [(s.kv_seq, np.asarray(s.tokens[:-1])) for s in self._running if s.kv_seq != exclude]
        return out

    def _fill_from_holders(self, seq: int, prefix: np.ndarray, have: int, extra=()) -> int:
        """Give ``seq`` (which holds KV for ``prefix[:have]``) the longest prefix of ``prefix`` any other sequence
        holds, by ``llama_memory_seq_cp``. Returns the number of positions ``seq`` now holds."""
        best, src = have, None
        for q, toks in list(extra) + self._holders(seq):
            m = min(len(toks), len(prefix))
            if m <= best:
                continue
            neq = np.flatnonzero(toks[:m] != prefix[:m])
            n = int(neq[0]) if len(neq) else m
            if n > best:
                best, src = n, q
        if src is not None:
            L = self._L
            L.llama_memory_seq_rm(self._mem, seq, -1, -1)
            L.llama_memory_seq_cp(self._mem, src, seq, 0, best)
            if src in self._cached:
                self._cached.move_to_end(src)
        return best

    # -- llama_decode ------------------------------------------------------------------------------------
    def _decode(self, tokens, pos, seqs, logits: bool, logits_from: int = 0) -> np.ndarray | None:
        """``llama_decode`` of (token, position, sequence id) triples, in chunks of ``n_batch``.

        Args:
            tokens, pos, seqs: equal-length int sequences (lists or arrays).
            logits: whether to return logits.
            logits_from: the first triple whose logits are returned (with ``logits``).
        Returns:
            ``[n - logits_from, vocab]`` float32 logits when ``logits`` (a view of llama.cpp's buffer when only the
            last call returned logits: valid until the next ``llama_decode``), else None. A full KV cache evicts
            cached sequences (least recently used first) and retries.

        Raises:
            RuntimeError: llama_decode failed, or the KV cache is full with nothing left to evict (naming
            ``kv_cells``).
        """
        L, cap = self._L, self.config.n_batch
        out = []
        seq_id = self._batch.seq_id
        for a in range(0, len(tokens), cap):
            n = min(cap, len(tokens) - a)
            self._batch.n_tokens = n
            self._b_token[:n] = tokens[a:a + n]
            self._b_pos[:n] = pos[a:a + n]
            first = min(n, max(0, logits_from - a)) if logits else n  # this chunk's first triple with logits
            self._b_logits[:first] = 0
            self._b_logits[first:n] = 1
            n_out = n - first
            for i in range(n):
                seq_id[i][0] = seqs[a + i]
            t0 = time.perf_counter()
            while True:
                rc = L.llama_decode(self.ctx, self._batch)
                if rc != 1 or not self._cached:
                    break
                self._drop_cached()  # 1: no KV slot for the batch; make room and try again
            if rc == 1:
                raise RuntimeError(f"kv_cells: the llama.cpp KV cache ({self.config.kv_cells} cells) is full")
            if rc != 0:
                raise RuntimeError(f"llama_decode failed (return code {rc})")
            self.stats.forward_passes += 1
            if n_out:  # the buffer is reused by the next call: copy all but the last chunk's
                view = self._logits_view(n_out)
                out.append(view if a + n >= len(tokens) else view.copy())
            elif self.record_steps:
                self.prefill_seconds.append((1, n, time.perf_counter() - t0))
        if not logits:
            return None
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _logits_view(self, n: int) -> np.ndarray:
        """``[n, vocab]`` view of the logits of the last ``llama_decode`` (no copy; the numpy wrapper is cached
        per buffer address, as building one costs more than a small model's argmax)."""
        ptr = self._L.llama_get_logits(self.ctx)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value
        if addr != self._logits_addr:
            self._logits_buf = np.ctypeslib.as_array(ptr, shape=(self.config.n_batch, self._vocab))
            self._logits_addr = addr
        return self._logits_buf[:n]

    # -- admission (prefill) ---------------------------------------------------------------------------
    def _admit(self, new: list[Seq]) -> None:
        now = time.perf_counter()
        for s in new:
            s.counters.queue_seconds = now - s.t_submit
        new.sort(key=lambda s: s.n_prompt)
        for s in new:  # running + new <= max_batch_size and cached <= cache_slots: never evicts
            s.kv_seq = self._take_slot()
        new = self._admit_predicted(new)
        if not new:
            return
        prefixes = [np.asarray(s.tokens[:-1], dtype=np.int64) for s in new]
        have = [0] * len(new)
        extra: list[tuple[int, np.ndarray]] = []
        if len(new) > 1:  # the common part once, in the longest prompt's sequence; the others copy it
            longest, host = prefixes[-1], new[-1]
            if all(np.array_equal(longest[: len(p)], p) for p in prefixes[:-1]):
                shared = longest
            else:
                m = min(len(p) for p in prefixes)
                diff = np.flatnonzero((np.stack([p[:m] for p in prefixes]) != prefixes[0][:m]).any(0))
                shared = longest[: int(diff[0]) if len(diff) else m]
            n = self._fill_from_holders(host.kv_seq, shared, 0)
            host.counters.prefill_tokens_cached += n
            host.counters.prefill_tokens_computed += len(shared) - n
            self._prefill([(host.kv_seq, shared, n)])
            have[-1] = len(shared)
            extra = [(host.kv_seq, shared)]
        jobs = []
        for i, (s, p) in enumerate(zip(new, prefixes, strict=False)):
            n = self._fill_from_holders(s.kv_seq, p, have[i], extra if s is not new[-1] else ())
            s.counters.prefill_tokens_cached += n - have[i]
            s.counters.prefill_tokens_computed += len(p) - n + 1  # + the last prompt token, fed by the first step
            jobs.append((s.kv_seq, p, n))
        self._prefill(jobs)
        self._running.extend(new)

    def _admit_predicted(self, new: list[Seq]) -> list[Seq]:
        """Prefill and first step in ONE ``llama_decode`` for the new rows whose prompt and prediction lie on the
        longest prompt plus its prediction (a Lookahead Reasoning cycle: branch ``j`` is the context plus drafts
        ``0..j-1`` and predicts draft ``j``, so the longest branch's prompt holds every other branch's prompt and
        prediction). That ``host`` row feeds its prompt from its first uncached position (or from the first position
        whose logits a row needs, if that comes earlier) and its prediction; the logits of the fed
        positions verify every such row's prediction at once (:meth:`~.scheduler.BatchScheduler._commit_flat`,
        as a decoding step would), each row copies the host's KV up to what it kept (``llama_memory_seq_cp``), and
        the drafted text is computed once instead of once in the prefill and again in each branch's first step.

        Returns:
            the rows left for the ordinary admission (never the host: it is running, or finished in the call).
        """
        host = new[-1]
        feed = host.tokens + ([] if host.collect_probs else self._predicted(host, self._room(host)))
        rows = []
        for s in new[:-1]:
            m = len(s.tokens)
            if s.collect_probs or feed[:m] != s.tokens:  # draft-model proposal rows take no predictions
                continue
            pred = self._predicted(s, self._room(s))
            k = 0
            while k < len(pred) and m + k < len(feed) and pred[k] == feed[m + k]:
                k += 1
            if k:
                rows.append((s, pred[:k]))
        if not rows and len(feed) == len(host.tokens):
            return new
        rows.append((host, feed[len(host.tokens):]))
        lo = min(len(s.tokens) for s, _ in rows) - 1  # the first fed position whose logits a row needs
        cached = min(self._fill_from_holders(host.kv_seq, np.asarray(host.tokens[:-1], dtype=np.int64), 0), lo)
        self._L.llama_memory_seq_rm(self._mem, host.kv_seq, cached, -1)
        n_host = len(host.tokens)
        host.counters.prefill_tokens_cached += cached
        host.counters.prefill_tokens_computed += n_host - cached
        logits = self._decode(feed[cached:], range(cached, len(feed)), [host.kv_seq] * (len(feed) - cached),
                              logits=True, logits_from=lo - cached)
        seqs = [s for s, _ in rows]
        self._running.extend(seqs)
        take = np.concatenate([np.arange(len(s.tokens) - 1, len(s.tokens) + len(p)) - lo for s, p in rows])
        for s, p in rows:
            s.from_prediction = bool(p)
        kept, finished = self._commit_flat([(p, None) for _, p in rows], logits[take], seqs)
        for (s, _), kp in zip(rows[:-1], kept, strict=False):  # KV of the prompt and the kept positions: the host's
            s.counters.prefill_tokens_cached += s.n_prompt - 1
            s.counters.prefill_tokens_computed += 1  # its last prompt token, fed in the host's call
            self._L.llama_memory_seq_cp(self._mem, host.kv_seq, s.kv_seq, 0, s.n_prompt - 1 + kp)
        self._L.llama_memory_seq_rm(self._mem, host.kv_seq, n_host - 1 + kept[-1], -1)
        for s in finished:
            self._release(s)
        fused = {id(s) for s in seqs}
        return [s for s in new if id(s) not in fused]

    def _prefill(self, jobs: list[tuple[int, np.ndarray, int]]) -> None:
        """KV for ``prefix[start:]`` of each (sequence id, prefix, start), all in as few calls as ``n_batch`` allows."""
        jobs = [j for j in jobs if len(j[1]) > j[2]]
        if not jobs:
            return
        tokens = np.concatenate([p[a:] for _, p, a in jobs])
        pos = np.concatenate([np.arange(a, len(p)) for _, p, a in jobs])
        seqs = np.concatenate([np.full(len(p) - a, q) for q, p, a in jobs])
        self._decode(tokens, pos, seqs, logits=False)

    # -- decoding --------------------------------------------------------------------------------------
    def _step(self) -> None:
        """One ``llama_decode`` for the whole running batch: row ``r`` feeds its last token and its proposals at
        consecutive positions under its sequence id, rows one after another (no padding); the logits of every
        fed position come back, are verified (:meth:`~.scheduler.BatchScheduler._commit_flat`), and the KV of
        rejected proposals is removed. Plain Python lists and one numpy view of llama.cpp's logits: at ~1 ms per
        token, tensors built per step cost a quarter of the step ("Where our `ar` on llama.cpp spent its time",
        benchmarks/journal.md#2026-12-07-lean-step)."""
        t0 = time.perf_counter()
        seqs = self._running
        props = self._proposals()
        tokens: list[int] = []
        pos: list[int] = []
        ids: list[int] = []
        for s, (p, _) in zip(seqs, props, strict=False):
            base = len(s.tokens) - 1
            tokens.append(s.tokens[-1])
            tokens.extend(p)
            pos.extend(range(base, base + 1 + len(p)))
            ids.extend([s.kv_seq] * (1 + len(p)))
        logits = self._decode(tokens, pos, ids, logits=True)
        first = [len(s.tokens) - 1 for s in seqs]  # each row's first fed position, before tokens are appended
        fed = [1 + len(p) for p, _ in props]
        kept, finished = self._commit_flat(props, logits)
        for r, s in enumerate(seqs):
            if kept[r] < fed[r]:  # rejected proposals (or tokens after a stop): their KV goes
                self._L.llama_memory_seq_rm(self._mem, s.kv_seq, first[r] + kept[r], -1)
        if self.record_steps:
            self.step_seconds.append((len(seqs), max(fed), time.perf_counter() - t0))
        for s in finished:
            self._release(s)

    def _release(self, s: Seq) -> None:
        """A finished request keeps its KV as a cached sequence (LRU); a cancelled one frees it."""
        self._running.remove(s)
        if s.finish != "cancelled" and self.config.cache_slots > 0:
            self._cached[s.kv_seq] = np.asarray(s.tokens[:-1], dtype=np.int64)
            while len(self._cached) > self.config.cache_slots:
                self._drop_cached()
        else:
            self._L.llama_memory_seq_rm(self._mem, s.kv_seq, -1, -1)
            self._free.append(s.kv_seq)
        s.kv_seq = -1
        self._complete(s)

    def _reset_batch(self) -> None:
        """After a failed step: every sequence id that is not a cached entry is emptied and free again."""
        held = set(self._cached)
        n_seq = self.config.max_batch_size + self.config.cache_slots
        for q in range(n_seq):
            if q not in held:
                self._L.llama_memory_seq_rm(self._mem, q, -1, -1)
        self._free = [q for q in range(n_seq - 1, -1, -1) if q not in held]

    def _shutdown(self) -> None:
        L = self._L
        L.llama_batch_free(self._batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)
