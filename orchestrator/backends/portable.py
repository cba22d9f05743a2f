"""The portable engine: any Hugging Face causal LM through PyTorch/transformers, on CPU or GPU.

What it does per engine instance (one background scheduler thread):

- **In-flight batching.** Callers (threads or asyncio tasks) submit request groups; the scheduler admits
  them into the running batch between decoding steps and a finished sequence leaves the batch at once
  (its row is freed by moving the last row into its place).
- **One forward per decoding step for the whole batch.** Ragged rows share a :class:`BatchKVCache`;
  an explicit 4-D attention mask and explicit ``position_ids`` make padding and holes invisible.
- **Prefix caching.** Admission looks up each prompt in a block-hashed :class:`PrefixCache`; when several
  new prompts share an uncached prefix (the branches of a Lookahead Reasoning cycle) it is prefilled once
  first; the remaining suffixes are prefilled together in one forward. Finished sequences store their KV,
  so the next cycle's prefix is served from cache.
- **Token-level speculative decoding** per request (n-gram prompt lookup, a draft-model engine, Medusa heads
  on the target's last hidden state, or an EAGLE-3 head on three of its inner layers), verified inside the same
  batched forward (see :mod:`.spec_decode`).

The engine is the model side of :class:`~.scheduler.BatchScheduler` (request groups, the scheduler thread,
verification of the SD proposals, stop strings and completion, shared with the llama.cpp backend): what each
forward holds and the KV caches. :class:`~.model_runner.ModelRunner` loads the model, picks its dtype
and runs the forwards; the proposers are in :mod:`.spec_decode`, the caches in :mod:`.kv_cache`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import GenerationRequest, check_gpu_mode, validate_request
from .drafters import check_method, make_proposers
from .eagle import Eagle3Head
from .kv_cache import BatchKVCache, PrefixCache
from .medusa import MedusaHeads
from .model_runner import DtypeChoice, ModelRunner
from .scheduler import BatchScheduler, Seq
from .tokenizer import TokenizerAccess

log = logging.getLogger(__name__)


class PortableEngineConfig(BaseModel):
    """Settings of a :class:`PortableEngine` (validated; errors name the field)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., description="Hugging Face checkpoint folder")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on CUDA; on a CPU with native bf16 matmul, bfloat16 when a start-up "
                            "micro-benchmark finds it faster for this model, else float32 (see choose_dtype)")
    device: str = "cpu"
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads; None = torch default")
    attn_implementation: Literal["auto", "sdpa", "grouped_sdpa", "eager"] = Field(
        "auto", description="auto: grouped_sdpa with static_cache (its mask spans every slot, so sdpa's copy of keys "
                            "and values per query head costs most there; backends/attention.py), else sdpa")
    max_batch_size: int = Field(64, ge=1, description="rows in the running batch")
    prefix_cache: bool = True
    prefix_cache_mb: float = Field(256.0, gt=0, description="memory bound of the prefix cache, MiB")
    block_size: int = Field(16, ge=1, description="tokens per prefix-cache block")
    compact_slack: int = Field(64, ge=0, description="compact the batch cache when holes exceed this many slots")
    static_cache: bool = Field(False, description="GPU mode: pre-allocated KV cache that never moves")
    static_cache_tokens: int | None = Field(None, ge=16, description="slots per row (default: context + 128)")
    cuda_graphs: bool = Field(False, description="GPU mode: replay captured CUDA graphs for decoding steps "
                                                 "(needs device cuda and static_cache)")
    graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    graph_widths: tuple[int, ...] = Field((1,), description="captured new-token counts per row (1 + SD tokens)")
    medusa_heads: str | None = Field(None, description="folder of Medusa heads trained for this model "
                                                       "(medusa_lm_head.safetensors + config.json, TensorRT-LLM's "
                                                       "--medusa_model_dir layout): enables spec.method 'medusa'")
    eagle3_head: str | None = Field(None, description="folder of an EAGLE-3 draft head trained for this model "
                                                      "(model.safetensors + config.json, the layout vLLM and "
                                                      "TensorRT-LLM's speculative_model_dir read): enables "
                                                      "spec.method 'eagle3'")
    compile: bool = Field(False, description="torch.compile the model (inductor, dynamic shapes) and compile its "
                                             "forwards at start-up: a forward of a small model loses most of its "
                                             "per-call Python overhead; start-up takes seconds to minutes longer")

    @model_validator(mode="after")
    def _check_gpu_mode(self) -> PortableEngineConfig:
        check_gpu_mode(self.static_cache, self.cuda_graphs, self.device, self.compile)
        return self


class PortableEngine(BatchScheduler, TokenizerAccess):
    """Batch generation engine over a transformers causal LM (see module docstring).

    Args:
        config: :class:`PortableEngineConfig`.
        draft_engine: another engine with the same tokenizer, used by requests whose ``spec.method`` is
            ``draft_model`` to propose tokens.
        model: an already built model (e.g. random weights for benchmarks); ``config.model`` then only
            names the tokenizer folder.

    Raises:
        ValueError: invalid configuration; ``OSError`` if the checkpoint cannot be loaded.
    """

    name = "portable"
    supports_stop_count = True  # GenerationRequest.stop_count > 1: several steps in one call

    def __init__(self, config: PortableEngineConfig, draft_engine: PortableEngine | None = None,
                 model=None) -> None:
        self.config = config
        self.draft_engine = draft_engine
        self.max_batch_size = config.max_batch_size
        self.device = torch.device(config.device)
        # The scheduler thread loads the model, picks the dtype and runs every forward: torch's OpenMP pool
        # belongs to the thread that starts it, and a thread computing after another thread's pool has run
        # gets ~0.55x the speed (SmolLM2 decode, 2 threads: 30 ms per step in the loading thread, 54 ms in
        # another). Errors while loading are raised here.
        self._start_scheduler(model, make_proposers(self.name, draft_model=draft_engine))

    def _setup(self, model) -> None:
        """Load the model and build the caches (runs in the scheduler thread)."""
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self.runner = ModelRunner(self.config, model)
        mc = self.runner.model.config
        self._load_tokenizer(self.config.model, mc, getattr(self.runner.model, "generation_config", None))
        self._pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.prefix_cache = PrefixCache(self.config.block_size, int(self.config.prefix_cache_mb * (1 << 20)))
        self._cache = self.runner.running_cache(self._context)
        self.medusa: MedusaHeads | None = None
        self.eagle3: Eagle3Head | None = None
        # Proposers that read the target's features: which output_hidden_states each needs (its columns of the
        # runner's concatenated features) and how many past positions a row keeps for it.
        layers: list[int] = []
        self._feature_cols: dict[str, slice] = {}
        self._feature_window = 0
        h = mc.hidden_size
        if self.config.medusa_heads:
            heads = MedusaHeads.from_pretrained(self.config.medusa_heads)
            fits = (h, self.runner.model.get_output_embeddings().out_features)
            if (heads.hidden_size, heads.vocab_size) != fits:
                raise ValueError(f"medusa_heads: heads for hidden size {heads.hidden_size} and vocabulary "
                                 f"{heads.vocab_size} do not fit this model (hidden size {fits[0]}, "
                                 f"vocabulary {fits[1]})")
            self.medusa = heads.to(device=self.device, dtype=self.runner.dtype)
            self._feature_cols["medusa"] = slice(len(layers) * h, (len(layers) + 1) * h)
            layers.append(-1)
            self._feature_window = 1
        if self.config.eagle3_head:
            embed = self.runner.model.get_input_embeddings().weight
            try:
                head = Eagle3Head.from_pretrained(self.config.eagle3_head, embed, mc.num_hidden_layers)
            except ValueError as exc:
                raise ValueError(f"eagle3_head: {exc}") from None
            if not all(0 < i < mc.num_hidden_layers for i in head.aux_layers):
                raise ValueError(f"eagle3_head: feature layers {head.aux_layers} are not inner layers of this "
                                 f"model's {mc.num_hidden_layers}")
            self.eagle3 = head.to(device=self.device, dtype=self.runner.dtype)
            self._feature_cols["eagle3"] = slice(len(layers) * h, (len(layers) + 3) * h)
            layers.extend(head.aux_layers)
            self._feature_window = max(self._feature_window, head.attention_window)
        self.runner.feature_layers = tuple(layers)
        self._proposers = make_proposers(self.name, draft_model=self.draft_engine, medusa=self.medusa,
                                         eagle3=self.eagle3)
        if self.config.compile:
            self.runner.warm_up(min(self._context, 64), hidden=bool(layers))

    @property
    def model(self):
        """The loaded ``torch.nn.Module``."""
        return self.runner.model

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def dtype_choice(self) -> DtypeChoice:
        """The dtype the engine runs in and why (:func:`.model_runner.choose_dtype`)."""
        return self.runner.dtype_choice

    @classmethod
    def from_pretrained(cls, model: str, draft_engine: PortableEngine | None = None, **kwargs) -> PortableEngine:
        """Shorthand for ``PortableEngine(PortableEngineConfig(model=model, **kwargs))``."""
        return cls(PortableEngineConfig(model=model, **kwargs), draft_engine=draft_engine)

    # -- public generation API -------------------------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        """Raise ``ValueError`` naming the field if ``req`` cannot be served (:func:`.base.validate_request`,
        several stops per call, and the SD methods of :data:`.drafters.DRAFTERS` this engine was built for)."""
        validate_request(req, self._vocab, self._context, multi_stop=True)
        check_method(self.name, req.spec, self._proposers)
        if req.spec.method == "medusa" and req.spec.num_speculative_tokens > self.medusa.num_heads:
            raise ValueError(f"spec.num_speculative_tokens: {req.spec.num_speculative_tokens} is more than the "
                             f"engine's {self.medusa.num_heads} Medusa heads")

    def _reset_batch(self) -> None:
        """After a failed step: an empty running cache (the failed rows' KV is dropped)."""
        if self.config.static_cache:
            while self._cache.rows:
                self._cache.remove_row(self._cache.rows - 1)
        else:
            self._cache = self.runner.new_cache()

    def reset_prefix_cache(self) -> None:
        with self._cv:
            self.prefix_cache.clear()

    # -- admission (prefill) ---------------------------------------------------------------------------
    def _admit(self, new: list[Seq]) -> None:
        use_cache = self.config.prefix_cache
        now = time.perf_counter()
        for s in new:
            s.counters.queue_seconds = now - s.t_submit
        new.sort(key=lambda s: s.n_prompt)
        # KV is needed for tokens[:-1]; the last prompt token is fed by the first decoding step.
        prefixes = [tuple(s.tokens[:-1]) for s in new]
        if use_cache and len(new) > 1:
            self._prefill_shared(new, prefixes)
        # Rows whose proposer reads the target's features propose at their first decoding step from those of
        # their last prefilled token, so that token is always computed, never served whole from the prefix cache.
        feat = [s.req.spec.method in self._feature_cols for s in new]
        matched: list[tuple[int, torch.Tensor | None]] = []
        for s, p, m in zip(new, prefixes, feat, strict=False):
            n, kv = self.prefix_cache.match(p, max(0, len(p) - m)) if use_cache else (0, None)
            matched.append((n, kv))
            s.counters.prefill_tokens_cached += n
        group = self.runner.new_cache()
        rows = group.add_rows([kv for _, kv in matched])
        suffixes = [list(p[n:]) for p, (n, _) in zip(prefixes, matched, strict=False)]
        width = max(len(x) for x in suffixes)
        if width:
            ids = torch.full((len(new), width), self._pad, dtype=torch.long)
            pos = torch.zeros((len(new), width), dtype=torch.long)
            real = torch.zeros((len(new), width), dtype=torch.bool)
            for r, (suf, (n, _)) in enumerate(zip(suffixes, matched, strict=False)):
                ids[r, : len(suf)] = torch.tensor(suf, dtype=torch.long)
                pos[r] = torch.arange(n, n + width)
                real[r, : len(suf)] = True
                new[r].counters.prefill_tokens_computed += len(suf)
            hidden = self._forward(group, ids, pos, real, logits=False, hidden=any(feat))
            for r, suf in enumerate(suffixes):
                if feat[r] and suf:  # columns 0 .. len(suf) - 1 are positions n .. len(prefix) - 1 = tokens[-2]
                    new[r].features = hidden[r, max(0, len(suf) - self._feature_window): len(suf)].clone()
        if use_cache:
            for r, p in enumerate(prefixes):
                if len(p) - matched[r][0] >= self.config.block_size:
                    self.prefix_cache.insert(p, group.row_kv(rows[r]))
        for s in new:
            s.counters.prefill_tokens_computed += 1  # the last prompt token, fed by the first step
        self._merge(group, new)

    def _prefill_shared(self, new: list[Seq], prefixes: list[tuple[int, ...]]) -> None:
        """Prefill, once and in one row, what the new prompts share, if it is not cached yet.

        ``prefixes`` are sorted by length. When each is a prefix of the longest (the target's branches of a
        Lookahead Reasoning cycle: branch j is the context plus drafts 0..j-1) the longest is the shared part,
        so every branch then reads its KV from the prefix cache instead of prefilling the drafts again per
        row; otherwise the longest common prefix is.
        """
        lcp = prefixes[-1]
        if not all(lcp[: len(p)] == p for p in prefixes[:-1]):
            lcp = tuple(os.path.commonprefix(prefixes))  # works on any sequences, not only strings
        bs = self.config.block_size
        if len(lcp) < bs:
            return
        n, kv = self.prefix_cache.match(lcp, len(lcp))
        if len(lcp) - n < bs:
            return
        tmp = self.runner.new_cache()
        tmp.add_rows([kv])
        suffix = list(lcp[n:])
        ids = torch.tensor([suffix], dtype=torch.long)
        pos = torch.arange(n, len(lcp))[None]
        real = torch.ones((1, len(suffix)), dtype=torch.bool)
        self._forward(tmp, ids, pos, real, logits=False)
        self.prefix_cache.insert(lcp, tmp.row_kv(0))
        new[-1].counters.prefill_tokens_computed += len(suffix)  # the longest prompt: the others reuse it

    def _merge(self, group: BatchKVCache, seqs: list[Seq]) -> None:
        if not self._running and not self.config.static_cache:
            self._cache = group
            self._running = list(seqs)
            return
        self._cache.add_rows([group.row_kv(r) for r in range(group.rows)])
        self._running.extend(seqs)

    def _forward(self, cache: BatchKVCache, ids: torch.Tensor, pos: torch.Tensor, real: torch.Tensor,
                 logits: bool, hidden: bool = False):
        """:meth:`.ModelRunner.forward`, counted (and, with ``record_steps``, prefill forwards timed)."""
        t0 = time.perf_counter()
        out = self.runner.forward(cache, ids, pos, real, logits, hidden)
        self.stats.forward_passes += 1
        if self.record_steps and not logits:
            self.prefill_seconds.append((ids.shape[0], ids.shape[1], time.perf_counter() - t0))
        return out

    # -- decoding --------------------------------------------------------------------------------------
    def _step(self) -> None:
        """One decoding forward for the whole running batch, every row's SD proposals included.

        Row ``r`` feeds its last token plus its ``k_r`` proposals, padded to the batch's width; positions and the
        padding mask are built with tensor ops. Greedy rows are verified together from one argmax (one
        device-to-host copy of ``[rows, width]`` ids); sampled rows, which need their own RNG and warpers, copy
        only their own logits. Slots of rejected proposals, padding and tokens cut by a stop become holes.
        """
        t0 = time.perf_counter()
        seqs = self._running
        props = self._proposals()
        width = 1 + max(len(p) for p, _ in props)
        if self.runner.graphs is not None:  # pad up to a captured width (extra positions are invalid padding)
            width = next((w for w in self.runner.graphs.widths if w >= width), width)
        ids, real, pos = self._step_inputs(props, width)
        start_slot = self._cache.length
        feat = [r for r, s in enumerate(seqs) if s.req.spec.method in self._feature_cols]
        if feat:  # the rows' next proposals read the features of the positions they commit now
            logits, hidden = self._forward(self._cache, ids, pos, real, logits=True, hidden=True)
        else:
            logits = self._forward(self._cache, ids, pos, real, logits=True)
        kept, finished = self._commit(props, ids, real, logits)
        for r in feat:  # new slots 0 .. kept - 1 predicted the kept tokens
            s = seqs[r]
            new = hidden[r, : kept[r]]
            s.features = (new if s.features is None else torch.cat([s.features, new]))[-self._feature_window:].clone()
        self._cache.keep_new(start_slot, torch.tensor(kept))
        dt = time.perf_counter() - t0
        if self.record_steps:
            self.step_seconds.append((len(seqs), width, dt))
        for s in finished:
            self._release(s)
        if self._cache.holes() > self.config.compact_slack:
            self._cache.compact()

    def _release(self, s: Seq) -> None:
        """Remove a finished or cancelled sequence from the batch, cache its KV, complete it."""
        r = self._running.index(s)
        if self.config.prefix_cache and s.finish != "cancelled":
            kv = self._cache.row_kv(r)
            self.prefix_cache.insert(tuple(s.tokens[: kv.shape[3]]), kv)
        moved = self._cache.remove_row(r)
        if moved is not None:
            self._running[r] = self._running[moved]
        self._running.pop()
        self._complete(s)
