"""The portable engine's model runner: loads a Hugging Face causal LM, picks its dtype, and runs forwards over
a :class:`~.kv_cache.BatchKVCache` (the scheduler in :mod:`.portable` decides what goes into each forward).

The model is driven through its standard ``forward(input_ids, attention_mask, position_ids, cache)``;
``attention_mask`` is a pre-built 4-D mask, which transformers' ``create_causal_mask`` returns as it is (for
models with sliding-window layers, the ``{"full_attention": mask, "sliding_attention": mask}`` mapping their
forward accepts instead), so the same code serves Llama, Qwen2 and Qwen3 checkpoints. In GPU mode
(``static_cache`` + ``cuda_graphs``) decoding forwards of the running batch replay captured CUDA graphs
(:mod:`.cuda_graphs`).
"""

from __future__ import annotations

import copy
import inspect
import logging
import time
from dataclasses import dataclass, field

import torch

from .kv_cache import BatchKVCache

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype an engine runs in and why (``reason``; with ``dtype: auto`` the micro-benchmark's times)."""

    dtype: str
    reason: str
    ms_per_step: dict[str, float] = field(default_factory=dict)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (x86 ``avx512_bf16`` or ``amx_bf16``, Arm ``bf16``), from
    ``/proc/cpuinfo`` (False where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _dummy_ids(rows: int, length: int, vocab: int) -> torch.Tensor:
    """``[rows, length]`` int64 token ids spread over the vocabulary, for forwards whose time or shapes matter
    and whose tokens do not (the dtype micro-benchmark, the compile warm-up)."""
    return (torch.arange(rows * length).reshape(rows, length) * 7919) % vocab


def _decode_ms(model, rows: int, context: int = 64, steps: int = 6) -> float:
    """Median ms of one decoding forward of ``rows`` rows (one new token each) after a ``context``-token prefill
    (tokens are arbitrary ids: only the time is read)."""
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = _dummy_ids(rows, context, vocab).to(model.device)
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
        nxt = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            out = model(input_ids=nxt, use_cache=True, **{kw: cache})
            nxt = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def choose_dtype(model, device: torch.device, margin: float = 0.9) -> tuple[object, DtypeChoice]:
    """Resolve ``dtype: auto`` for a model loaded in float32 (returns the model to use and the choice).

    CUDA: bfloat16 (float16 where the GPU lacks bf16). CPU without native bf16 matmul: float32. CPU with it: a
    micro-benchmark times decoding forwards at 1 and 4 rows in both dtypes (a bf16 copy of the weights,
    interleaved, twice) and keeps bfloat16 only if it takes at most ``margin`` of float32's time at BOTH row
    counts: one row is every request's latency, four rows a cycle's branch call. Small models are bound by
    per-call overhead, where bf16's conversions cost more than its halved weight traffic saves (the demo trio:
    bf16 2x slower); SmolLM2-135M decodes one row 10% slower in bf16 on this project's CPU though four rows 25%
    faster, and its greedy GSM8K answers changed in 71 of 100 (issue 18,
    benchmarks/journal.md#2026-12-01-engine-economics), so it stays in float32. Reduced precision is not
    batch-invariant, so the ``exact`` judge's lossless guarantee holds in float32.
    """
    if device.type == "cuda":
        dt = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return model, DtypeChoice(dt, "auto: CUDA")
    if not cpu_has_native_bf16():
        return model, DtypeChoice("float32", "auto: no native bf16 matmul on this CPU")
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    times = {f"{name} x{rows}": 0.0 for name in ("float32", "bfloat16") for rows in (1, 4)}
    for _ in range(2):
        for name, m in (("float32", model), ("bfloat16", bf16)):
            for rows in (1, 4):
                times[f"{name} x{rows}"] += _decode_ms(m, rows) / 2
    ms = {k: round(v, 3) for k, v in times.items()}
    shown = ", ".join(f"{k} rows {v:.1f} ms" for k, v in ms.items())
    if all(ms[f"bfloat16 x{r}"] <= margin * ms[f"float32 x{r}"] for r in (1, 4)):
        return bf16, DtypeChoice("bfloat16", f"auto: bf16 faster at 1 and 4 rows ({shown})", ms)
    del bf16
    return model, DtypeChoice("float32", f"auto: bf16 not {1 - margin:.0%} faster at both 1 and 4 rows ({shown})", ms)


class ModelRunner:
    """One loaded model and the forwards the scheduler asks for. Build it in the thread that will run the
    forwards (torch's OpenMP pool belongs to the thread that starts it, see ``PortableEngine``).

    Args:
        config: the engine's :class:`~.portable.PortableEngineConfig` (``model``, ``dtype``, ``device``,
            ``attn_implementation``, the GPU-mode fields).
        model: an already built model (random weights for benchmarks); None loads ``config.model``. Its attention
            implementation is set in place to the configured one (``auto`` with ``static_cache``: ``grouped_sdpa``);
            with ``auto`` and no static cache it keeps its own.

    Attributes:
        model: the module, in ``dtype`` (``torch.dtype``), chosen as ``dtype_choice`` says.

    Raises:
        OSError: the checkpoint cannot be loaded.
    """

    def __init__(self, config, model=None) -> None:
        from transformers import AutoModelForCausalLM

        self.config = config
        self.device = torch.device(config.device)
        load_dtype = torch.float32 if config.dtype == "auto" and self.device.type == "cpu" else (
            DTYPES.get(config.dtype, torch.bfloat16))
        attn = config.attn_implementation
        if attn == "auto":
            attn = "grouped_sdpa" if config.static_cache else "sdpa"
        if attn == "grouped_sdpa":
            from .attention import register

            register()
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(config.model, dtype=load_dtype, attn_implementation=attn)
        elif ((config.attn_implementation != "auto" or attn == "grouped_sdpa")
              and model.config._attn_implementation != attn):
            # in place; with auto and no static cache the caller's model keeps its own
            model.set_attn_implementation(attn)
        model = model.to(self.device).eval()
        self.dtype_choice = DtypeChoice(config.dtype, "configured") if config.dtype != "auto" else None
        if self.dtype_choice is None:
            model, self.dtype_choice = choose_dtype(model, self.device)
        self.dtype = DTYPES[self.dtype_choice.dtype]
        self.model = model.to(self.dtype)
        log.info("portable engine %s: dtype %s (%s)", config.model, self.dtype_choice.dtype, self.dtype_choice.reason)
        mc = self.model.config
        self._num_layers = mc.num_hidden_layers
        self._kv_heads = getattr(mc, "num_key_value_heads", None) or mc.num_attention_heads
        self._head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        sliding = "sliding_attention" in (getattr(mc, "layer_types", None) or [])
        self._mask_arg = (lambda m: {"full_attention": m, "sliding_attention": m}) if sliding else (lambda m: m)
        self.graphs = None  # a GraphRunner once running_cache() built the static cache it replays over
        self._running: BatchKVCache | None = None
        # torch.compile (TorchDynamo + Inductor, dynamic shapes) for decoding forwards: the compiled module
        # replaces the per-op Python of the transformers forward with generated C++ kernels; the weights and the
        # cache stay shared. Prefills stay eager: their shapes vary most, and a prefill is one call per request.
        # Dynamo still specialises sizes 0/1 (one row, one position), so a decoder takes a few graphs: rows 1 or
        # more x width 1 or more x mask or none (https://pytorch.org/docs/stable/torch.compiler.html).
        self._decode = torch.compile(self.model, dynamic=True) if config.compile else self.model
        # Forwards that also return features for proposers that read the target's hidden states (Medusa: the
        # last, EAGLE-3: three inner layers): the model's own forward with output_hidden_states, so there is no
        # second forward and logits keep any model-specific scaling or softcapping. ``feature_layers`` are indices
        # into that tuple (0 = the embeddings, i = the input of decoder layer i, -1 = the final norm's output:
        # transformers' capture_outputs, tie_last_hidden_states); the engine sets them before its first forward.
        # A function of its own, so that compiled it has its own graphs (dynamo's recompile limit).
        self.feature_layers: tuple[int, ...] = (-1,)
        model_ = self.model

        def logits_and_features(**kwargs):
            out = model_(**kwargs, output_hidden_states=True)
            states = out.hidden_states
            return out.logits, torch.cat([states[i] for i in self.feature_layers], dim=-1)

        self._decode_hidden = (torch.compile(logits_and_features, dynamic=True) if config.compile
                               else logits_and_features)

    def new_cache(self) -> BatchKVCache:
        """An empty dynamic cache (a group being admitted, a shared prefix being prefilled)."""
        return BatchKVCache(self._num_layers, self._kv_heads, self._head_dim, self.dtype, self.device)

    def running_cache(self, context: int) -> BatchKVCache:
        """The running batch's cache: dynamic, or (GPU mode) one static cache of ``context + 128`` slots per row
        (``static_cache_tokens``) for the engine's life, over which the CUDA graphs are captured."""
        if not self.config.static_cache:
            return self.new_cache()
        if self._running is None:
            from .cuda_graphs import GraphRunner, StaticBatchKVCache

            c = self.config
            rows = max(c.max_batch_size, max(c.graph_batch_sizes))
            slots = c.static_cache_tokens or context + 128
            self._running = StaticBatchKVCache(self._num_layers, self._kv_heads, self._head_dim, self.dtype,
                                               self.device, max_rows=rows, capacity=slots, max_new=max(slots, 512))
            if c.cuda_graphs:
                self.graphs = GraphRunner(self.model, self._running, self._cache_kw, self._mask_arg,
                                          c.graph_batch_sizes, c.graph_widths)
        return self._running

    def forward(self, cache: BatchKVCache, ids: torch.Tensor, pos: torch.Tensor, real: torch.Tensor,
                logits: bool, hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
        """One forward over ``cache``'s rows.

        Args:
            ids, pos: ``[rows, width]`` int64 token ids and positions; ``real``: ``[rows, width]`` bool, False for
                padding (invisible to attention, its KV slot becomes a hole).
            logits: return the ``[rows, width, vocab]`` logits (decoding); False: prefill, only the KV is kept.
            hidden: also return the ``[rows, width, len(feature_layers) * hidden_size]`` features (the hidden states
                of :attr:`feature_layers`, concatenated, in the model's dtype): ``(logits, features)`` with
                ``logits``, else the features alone (a prefill computes no logits then); such forwards run without
                CUDA graphs.
        """
        mask = cache.reserve(real.to(self.device))
        if self.graphs is not None and cache is self._running and logits and not hidden:
            out = self.graphs.run(ids.to(self.device), pos.to(self.device), mask)
            if out is not None:
                return out
        kwargs = {
            "input_ids": ids.to(self.device),
            "position_ids": pos.to(self.device),
            "attention_mask": self._mask_arg(mask),
            self._cache_kw: cache,
            "use_cache": True,
        }
        if not logits:
            kwargs["logits_to_keep"] = 1
            if hidden:
                states = self.model(**kwargs, output_hidden_states=True).hidden_states
                return torch.cat([states[i] for i in self.feature_layers], dim=-1)
            self.model(**kwargs)
            return None
        if hidden:
            return self._decode_hidden(**kwargs)
        return self._decode(**kwargs).logits

    @torch.inference_mode()
    def warm_up(self, prompt_tokens: int = 64, hidden: bool = False) -> float:
        """Run the decoding forwards a scheduler issues (one row or several, one position or SD widths, with and
        without a mask) on a throw-away cache, so that a compiled model compiles its graphs now rather than
        during the first requests. Returns the seconds it took.

        Args:
            prompt_tokens: prefill length (token ids are arbitrary: only the shapes matter).
            hidden: also the forwards that return features (an engine with Medusa heads or an EAGLE-3 head).
        """
        t0 = time.perf_counter()
        vocab = self.model.config.vocab_size
        for rows, width, want_hidden in ((r, w, h) for h in ((False, True) if hidden else (False,))
                                         for r, w in ((1, 1), (1, 3), (3, 1), (3, 4))):
            cache = self.new_cache()
            cache.add_rows([None] * rows)
            ids = _dummy_ids(rows, prompt_tokens, vocab)
            pos = torch.arange(prompt_tokens).expand(rows, -1)
            self.forward(cache, ids, pos, torch.ones_like(ids, dtype=torch.bool), logits=False)
            for step in range(3):  # step 1 leaves a hole in row 0: decoding with holes takes a mask
                cols = torch.arange(width)
                pos = (prompt_tokens + step * width + cols).repeat(rows, 1)  # contiguous, as the scheduler's
                self.forward(cache, ids[:, :width].clone(), pos, torch.ones((rows, width), dtype=torch.bool),
                             logits=True, hidden=want_hidden)
                cache.keep_new(cache.length - width, torch.tensor([width - (step == 1)] + [width] * (rows - 1)))
        seconds = time.perf_counter() - t0
        log.info("portable engine %s: compiled in %.1f s", self.config.model, seconds)
        return seconds
