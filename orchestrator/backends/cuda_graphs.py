"""GPU mode of the portable engine: a static (pre-allocated, never reallocated) batch KV cache and
CUDA-graph captured forwards.

On a GPU, eager transformers decoding is launch-bound (docs/design.md section 4.4: a Qwen3-1.7B shape takes 28 ms per
step eagerly against 2.7 ms of layer time). The fix is to replay one CUDA graph per decoding step. A graph
bakes in tensor addresses and shapes, so:

- :class:`StaticBatchKVCache` keeps ``[max_rows, kv_heads, capacity, head_dim]`` buffers for the engine's
  life, writes new keys/values with ``index_copy_`` at slots held in a device tensor (not Python ints), and
  lets attention read all ``capacity`` slots under a ``[rows, 1, new, capacity]`` mask. Rows are added,
  removed, shifted and compacted in place.
- :class:`GraphRunner` captures ``model.forward`` once per ``(rows, new)`` bucket (``rows`` rounded up to a
  captured batch size, padding rows attend only to themselves), copies each step's inputs into the captured
  buffers and replays.

transformers' own path (``generate(cache_implementation="static")``, compiled by the library on CUDA) was the
first choice, but it cannot hold ragged rows with holes, prefix-cached rows or speculative verification of a
varying number of tokens per row; wrapping the forward in ``torch.compile(mode="reduce-overhead")`` by hand
failed upstream with a CUDA-graph "overwritten" error in the static cache update (docs/design.md section 4.4).
The capture below uses ``torch.cuda.CUDAGraph`` directly (PyTorch "CUDA Graphs" docs: warm up on a side
stream, capture, replay with ``copy_`` into static inputs).
"""

from __future__ import annotations

import torch

from .kv_cache import BatchKVCache


class StaticBatchKVCache(BatchKVCache):
    """A :class:`BatchKVCache` whose buffers never move (required by CUDA graphs); also usable on CPU.

    Args:
        max_rows: rows it can hold (the largest batch).
        capacity: slots per row (>= the longest sequence plus one step's new tokens).
        max_new: the most new positions one forward writes (1 + speculative tokens, or a prefill chunk).

    Raises:
        RuntimeError: from :meth:`reserve` / :meth:`add_rows` when the fixed capacity is exhausted.
    """

    static = True

    def __init__(self, num_layers, kv_heads, head_dim, dtype, device, max_rows: int, capacity: int,
                 max_new: int = 512) -> None:
        self._fixed = (max_rows, capacity)
        super().__init__(num_layers, kv_heads, head_dim, dtype, device, max_rows, capacity)
        self._idx = torch.arange(max_new, dtype=torch.long, device=self.device)  # write slots of the next forward
        self._arange = torch.arange(capacity, dtype=torch.long, device=self.device)
        self.full_width = True  # update() returns every slot; masks cover every slot

    def _alloc(self, row_cap: int, slot_cap: int, shift: int) -> None:
        if getattr(self, "keys", None) is None:
            super()._alloc(row_cap, slot_cap, shift)
            return
        max_rows, capacity = self._fixed
        if row_cap > max_rows or slot_cap > capacity:
            need = slot_cap if slot_cap > capacity else row_cap
            raise RuntimeError(f"static KV cache full: need {need} (rows, slots) = ({row_cap}, {slot_cap}), "
                               f"have ({max_rows}, {capacity})")
        if shift and self.rows and self.length:
            n, s = self.rows, self.length
            for buf in self.keys + self.values:
                buf[:n, :, shift:shift + s] = buf[:n, :, :s].clone()
            self.valid[:n, shift:shift + s] = self.valid[:n, :s].clone()
            self.valid[:n, :shift] = False
        self.length += shift if self.rows else 0

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        n, new = self.rows, key_states.shape[-2]
        idx = self._idx[:new]
        self.keys[layer_idx][:n].index_copy_(2, idx, key_states)
        self.values[layer_idx][:n].index_copy_(2, idx, value_states)
        return self.keys[layer_idx][:n], self.values[layer_idx][:n]

    def reserve(self, new_valid: torch.Tensor) -> torch.Tensor:
        """As :meth:`BatchKVCache.reserve`, but the mask spans every slot: ``[rows, 1, new, capacity]``."""
        n, new = self.rows, new_valid.shape[1]
        capacity = self._fixed[1]
        if self.length + new > capacity and self.holes():
            self.compact()
        if self.length + new > capacity:
            raise RuntimeError(f"static KV cache full: {self.length + new} slots needed, capacity {capacity}")
        start, end = self.length, self.length + new
        self.valid[:n, start:end] = new_valid
        self._idx[:new] = torch.arange(start, end, device=self.device)
        self._write_start = start
        self.length = end
        allowed = torch.zeros((n, new, capacity), dtype=torch.bool, device=self.device)
        allowed[:, :, :start] = self.valid[:n, None, :start]
        allowed[:, :, start:end] = self._new_block(new_valid)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[:, None]


class GraphRunner:
    """Captures and replays ``model.forward`` per ``(rows, new)`` bucket on CUDA.

    Args:
        model: the causal LM (on CUDA, eval mode).
        cache: the engine's :class:`StaticBatchKVCache`.
        cache_kw: the forward's cache argument name (``cache`` or ``past_key_values``).
        mask_arg: turns the 4-D mask into the forward's ``attention_mask`` argument (the tensor, or the
            per-layer-type mapping of models with sliding-window layers).
        batch_sizes: captured row counts; a batch is padded up to the next one (larger batches run eagerly).
        widths: captured new-position counts (1 for decoding; ``1 + k`` with ``k`` speculative tokens).
    """

    def __init__(self, model, cache: StaticBatchKVCache, cache_kw: str, mask_arg,
                 batch_sizes=(1, 2, 4, 8), widths=(1,)) -> None:
        self.model, self.cache, self.cache_kw, self.mask_arg = model, cache, cache_kw, mask_arg
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.widths = tuple(sorted(widths))
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.replays = 0

    def bucket(self, rows: int, new: int) -> tuple[int, int] | None:
        b = next((x for x in self.batch_sizes if x >= rows), None)
        return (b, new) if b is not None and new in self.widths else None

    def _forward(self, ids, pos, mask):
        kwargs = {"input_ids": ids, "position_ids": pos, "attention_mask": self.mask_arg(mask),
                  self.cache_kw: self.cache, "use_cache": True}
        return self.model(**kwargs).logits

    def _capture(self, key):
        b, w = key
        cap = self.cache._fixed[1]
        ids = torch.zeros((b, w), dtype=torch.long, device=self.cache.device)
        pos = torch.zeros((b, w), dtype=torch.long, device=self.cache.device)
        mask = torch.zeros((b, 1, w, cap), dtype=self.cache.dtype, device=self.cache.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up (allocations, lazy inits) outside the graph
                self._forward(ids, pos, mask)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(ids, pos, mask)
        self.graphs[key] = (graph, ids, pos, mask, logits)

    def run(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """Replay the bucket's graph for this step (``ids``/``pos`` ``[rows, new]``, ``mask``
        ``[rows, 1, new, capacity]``); returns ``[rows, new, vocab]`` logits, or None when no bucket fits
        (the caller then runs eagerly)."""
        rows, new = ids.shape
        key = self.bucket(rows, new)
        if key is None:
            return None
        b, _ = key
        real_rows = self.cache.rows
        self.cache.rows = b  # padding rows (zero slots valid) take part, attending only to themselves
        try:
            if key not in self.graphs:
                self._capture(key)
            graph, s_ids, s_pos, s_mask, s_logits = self.graphs[key]
            s_ids.zero_()
            s_pos.zero_()
            s_mask.fill_(torch.finfo(self.cache.dtype).min)
            s_ids[:rows] = ids
            s_pos[:rows] = pos
            s_mask[:rows] = mask
            eye = torch.arange(new, device=mask.device)
            s_mask[rows:, 0, eye, self.cache._idx[:new]] = 0.0
            graph.replay()
            self.replays += 1
            return s_logits[:rows]
        finally:
            self.cache.rows = real_rows
