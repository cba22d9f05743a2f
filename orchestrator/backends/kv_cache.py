"""KV-cache structures of the portable engine: the running batch's cache and the prefix cache.

``BatchKVCache`` holds the keys/values of every sequence in the running batch in pre-allocated buffers
``[batch, kv_heads, capacity, head_dim]`` per layer, written in place (no per-step concatenation). Columns
are physical slots; a boolean ``valid[batch, capacity]`` mask says which slots hold a real token of that
row. Rows are right-aligned (a shorter row has invalid slots on the left), and slots of rejected
speculative tokens or of padding simply become invalid "holes". Attention therefore takes an explicit 4-D
mask built from ``valid`` and the causal order of the slots, and RoPE takes explicit ``position_ids``; the
physical layout never has to match the logical positions. The cache is compacted when holes pile up.

``PrefixCache`` stores the KV of token prefixes in fixed-size blocks keyed by a hash chain over block
contents (the scheme of vLLM's automatic prefix caching), evicting least-recently-used blocks beyond a
memory bound. Leaves are evicted before their parents. Unlike vLLM it also keeps the last, partial block of
each stored sequence (a "tail") and matches token by token inside the last block, because here a request's
prompt is usually exactly an earlier sequence (the next step's context is the finished step's tokens; the
branches of a cycle are prefixes of the longest one): the whole prompt is then served from cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache


class BatchKVCache(Cache):
    """In-place KV buffers for the running batch, usable as the ``cache`` of a transformers model.

    Args:
        num_layers, kv_heads, head_dim: the model's attention shape.
        dtype, device: of the buffers.
        row_capacity, slot_capacity: initial buffer sizes (both grow by doubling).

    Shapes: ``keys[l]`` / ``values[l]``: ``[row_capacity, kv_heads, slot_capacity, head_dim]`` of which
    rows ``[:rows]`` and slots ``[:length]`` are in use; ``valid``: ``[row_capacity, slot_capacity]`` bool.
    Row order is not stable: :meth:`remove_row` moves the last row into the freed place.
    """

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str, row_capacity: int = 4, slot_capacity: int = 64) -> None:
        # Cache's own layer list is unused: update() is overridden and masks are passed pre-built.
        super().__init__(layers=[])
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.rows = 0
        self.length = 0
        self._write_start = 0
        self._alloc(max(row_capacity, 1), max(slot_capacity, 1), shift=0)

    def _alloc(self, row_cap: int, slot_cap: int, shift: int) -> None:
        """(Re)allocate buffers, copying rows ``[:rows]`` and slots ``[:length]`` ``shift`` slots right."""
        shape = (row_cap, self.kv_heads, slot_cap, self.head_dim)
        old = getattr(self, "keys", None)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        valid = torch.zeros((row_cap, slot_cap), dtype=torch.bool, device=self.device)
        if old is not None and self.rows and self.length:
            n, s = self.rows, self.length
            for layer in range(self.num_layers):
                keys[layer][:n, :, shift:shift + s] = self.keys[layer][:n, :, :s]
                values[layer][:n, :, shift:shift + s] = self.values[layer][:n, :, :s]
            valid[:n, shift:shift + s] = self.valid[:n, :s]
        self.keys, self.values, self.valid = keys, values, valid
        self.length += shift if self.rows else 0

    # -- transformers Cache protocol -------------------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write ``[rows, kv_heads, new, head_dim]`` states at the slots reserved by :meth:`reserve`."""
        n, start = self.rows, self._write_start
        end = start + key_states.shape[-2]
        self.keys[layer_idx][:n, :, start:end] = key_states
        self.values[layer_idx][:n, :, start:end] = value_states
        return self.keys[layer_idx][:n, :, :end], self.values[layer_idx][:n, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def __len__(self) -> int:
        return self.num_layers

    # -- slots -----------------------------------------------------------------------------------------
    @property
    def slot_capacity(self) -> int:
        return self.valid.shape[1]

    def reserve(self, new_valid: torch.Tensor) -> torch.Tensor | None:
        """Reserve ``new_valid.shape[1]`` slots for the next forward and return its 4-D additive mask.

        Args:
            new_valid: ``[rows, new]`` bool, which of the new input positions are real tokens.

        Returns:
            ``[rows, 1, new, length + new]`` tensor in the cache dtype: 0 where a query may attend,
            ``finfo(dtype).min`` elsewhere. Query ``i`` of a row sees the row's valid old slots and its own
            valid new positions ``<= i``. None when nothing needs masking (one new position per row and
            no holes), which lets the attention kernel skip the mask.
        """
        n, new = self.rows, new_valid.shape[1]
        if self.length + new > self.slot_capacity:
            self._alloc(self.valid.shape[0], max(self.length + new, 2 * self.slot_capacity), shift=0)
        start, end = self.length, self.length + new
        self.valid[:n, start:end] = new_valid
        self._write_start = start
        self.length = end
        if new == 1 and bool(self.valid[:n, :end].all()):
            return None  # one query per row and no holes: plain attention over every slot
        allowed = torch.cat([self.valid[:n, None, :start].expand(-1, new, -1), self._new_block(new_valid)], dim=2)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[:, None]

    def _new_block(self, new_valid: torch.Tensor) -> torch.Tensor:
        """``[rows, new, new]`` bool: causal attention among the new positions to the valid ones, plus each
        position to itself (so a padding query never has every key masked: its output, and the KV it leaves
        in its never-valid slot, stay finite)."""
        new = new_valid.shape[1]
        causal = torch.ones((new, new), dtype=torch.bool, device=self.device).tril()
        eye = torch.eye(new, dtype=torch.bool, device=self.device)
        return (causal[None] & new_valid[:, None, :]) | eye[None]

    def keep_new(self, start: int, keep: torch.Tensor) -> None:
        """After a forward that wrote slots ``[start, length)``: keep the first ``keep[r]`` of them valid in row
        ``r`` and make the rest holes (rejected proposals, padding, tokens past a stop).

        Args:
            start: first slot of the last forward.
            keep: ``[rows]`` long.
        """
        cols = torch.arange(self.length - start, device=self.device)
        self.valid[: self.rows, start:self.length] &= cols[None] < keep.to(self.device)[:, None]

    def row_kv(self, row: int) -> torch.Tensor:
        """KV of one row's valid slots in slot order, ``[num_layers, 2, kv_heads, n_valid, head_dim]`` (a copy)."""
        idx = self.valid[row, : self.length].nonzero().squeeze(1)
        return torch.stack(
            [torch.stack([k[row, :, idx], v[row, :, idx]]) for k, v in zip(self.keys, self.values, strict=False)]
        )

    def valid_counts(self) -> torch.Tensor:
        """``[rows]`` long: valid slots per row."""
        return self.valid[: self.rows, : self.length].sum(dim=1)

    def holes(self) -> int:
        """Slots in use minus the longest row's valid count (what :meth:`compact` would free)."""
        if self.rows == 0 or self.length == 0:
            return 0
        return self.length - int(self.valid_counts().max())

    # -- rows ------------------------------------------------------------------------------------------
    def add_rows(self, rows: list[torch.Tensor | None]) -> list[int]:
        """Append rows holding the given KV (``[num_layers, 2, kv_heads, n_i, head_dim]``, or None for an
        empty row), right-aligned to the current length (which grows, shifting old rows, if a new row is
        longer). Returns the new rows' indices."""
        lengths = [0 if r is None else r.shape[3] for r in rows]
        target = max([self.length] + lengths)
        shift = target - self.length if self.rows else 0
        need_rows = self.rows + len(rows)
        row_cap = self.valid.shape[0]
        slot_cap = self.slot_capacity
        if need_rows > row_cap or target + 1 > slot_cap or shift:
            self._alloc(max(need_rows, 2 * row_cap if need_rows > row_cap else row_cap),
                        max(slot_cap, 2 * target + 16), shift=shift)
        self.length = target
        indices = []
        for r, n in zip(rows, lengths, strict=False):
            i = self.rows
            self.valid[i].zero_()
            if n:
                for layer in range(self.num_layers):
                    self.keys[layer][i, :, target - n:target] = r[layer, 0]
                    self.values[layer][i, :, target - n:target] = r[layer, 1]
                self.valid[i, target - n:target] = True
            self.rows += 1
            indices.append(i)
        return indices

    def remove_row(self, row: int) -> int | None:
        """Drop ``row``; the last row moves into its place. Returns the moved row's old index (or None)."""
        last = self.rows - 1
        moved = None
        if row != last:
            for layer in range(self.num_layers):
                self.keys[layer][row, :, : self.length] = self.keys[layer][last, :, : self.length]
                self.values[layer][row, :, : self.length] = self.values[layer][last, :, : self.length]
            self.valid[row, : self.length] = self.valid[last, : self.length]
            moved = last
        self.valid[last].zero_()
        self.rows -= 1
        if self.rows == 0:
            self.length = 0
        return moved

    def compact(self) -> None:
        """Squeeze out holes: every row keeps only its valid slots, right-aligned (row order kept)."""
        kvs = [self.row_kv(r) for r in range(self.rows)]
        self.rows, self.length = 0, 0
        self.add_rows(kvs)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


@dataclass
class _Block:
    parent: int | None
    tokens: tuple[int, ...]  # block_size tokens, or fewer for a tail (a sequence's last, partial block)
    kv: torch.Tensor  # [num_layers, 2, kv_heads, len(tokens), head_dim]


class PrefixCache:
    """Block-hashed prefix KV cache with LRU eviction.

    Args:
        block_size: tokens per block.
        max_bytes: memory bound for the stored KV; least-recently-used blocks are evicted beyond it.

    A block's key is ``hash((parent_key, block_tokens))`` so equal keys mean equal whole prefixes
    (stored tokens and parent keys are compared on lookup, so a hash collision cannot return wrong KV).
    Whole blocks are matched by key; after the last whole block, the children of that block (whole blocks
    and tails) are searched for the longest common prefix with the next tokens.
    """

    def __init__(self, block_size: int = 16, max_bytes: int = 256 << 20) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be > 0")
        self.block_size = block_size
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._children: dict[int | None, set[int]] = {}
        self._bytes = 0
        self.hits_tokens = 0
        self.lookup_tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        self._blocks.clear()
        self._children.clear()
        self._bytes = 0

    def _keys(self, tokens: tuple[int, ...], n_blocks: int):
        parent = None
        bs = self.block_size
        for i in range(n_blocks):
            block = tokens[i * bs:(i + 1) * bs]
            key = hash((parent, block))
            yield key, parent, block
            parent = key

    def match(self, tokens: tuple[int, ...], max_tokens: int) -> tuple[int, torch.Tensor | None]:
        """Longest cached prefix of ``tokens`` of at most ``max_tokens`` tokens.

        Returns:
            ``(n, kv)``: ``n`` matched tokens (whole blocks, then part of one more block or tail) and their KV
            ``[num_layers, 2, kv_heads, n, head_dim]`` (None when ``n == 0``).
        """
        bs = self.block_size
        found: list[tuple[int, _Block]] = []
        for key, parent, block in self._keys(tokens, max_tokens // bs):
            entry = self._blocks.get(key)
            if entry is None or entry.tokens != block or entry.parent != parent:
                break
            found.append((key, entry))
        self.lookup_tokens += max_tokens
        n = len(found) * bs
        rest = tuple(tokens[n:min(max_tokens, n + bs)])
        part, part_len = None, 0
        for key in self._children.get(found[-1][0] if found else None, ()) if rest else ():
            entry = self._blocks[key]
            k = 0
            while k < min(len(rest), len(entry.tokens)) and entry.tokens[k] == rest[k]:
                k += 1
            if k > part_len:
                part, part_len = (key, entry), k
        if part is not None:
            self._blocks.move_to_end(part[0])
        if not found and part is None:
            return 0, None
        for key, _ in reversed(found):  # leaves first, so the root ends most recent
            self._blocks.move_to_end(key)
        kvs = [entry.kv for _, entry in found] + ([part[1].kv[:, :, :, :part_len]] if part else [])
        self.hits_tokens += n + part_len
        return n + part_len, torch.cat(kvs, dim=3)

    def insert(self, tokens: tuple[int, ...], kv: torch.Tensor) -> int:
        """Store the blocks of ``tokens`` whose KV is ``kv[:, :, :, :len(tokens)]``: every whole block, then the
        rest as a tail (unless a stored child of the last block already starts with it).

        Returns:
            the number of newly stored blocks and tails.
        """
        length = min(len(tokens), kv.shape[3])
        bs = self.block_size
        n_blocks = length // bs
        added = 0
        touched = []
        parent = None
        for i, (key, parent_key, block) in enumerate(self._keys(tokens, n_blocks)):
            touched.append(key)
            parent = key
            if key not in self._blocks:
                self._store(key, parent_key, block, kv[:, :, :, i * bs:(i + 1) * bs])
                added += 1
        tail = tuple(tokens[n_blocks * bs:length])
        key = hash((parent, tail))
        if tail and key not in self._blocks and not any(
                self._blocks[k].tokens[: len(tail)] == tail for k in self._children.get(parent, ())):
            self._store(key, parent, tail, kv[:, :, :, n_blocks * bs:length])
            touched.append(key)
            added += 1
        for key in reversed(touched):
            self._blocks.move_to_end(key)
        while self._bytes > self.max_bytes and self._blocks:
            key, old = self._blocks.popitem(last=False)
            self._bytes -= old.kv.numel() * old.kv.element_size()
            self._children.get(old.parent, set()).discard(key)
            self._children.pop(key, None)
        return added

    def _store(self, key: int, parent: int | None, tokens: tuple[int, ...], kv: torch.Tensor) -> None:
        data = kv.clone()
        self._blocks[key] = _Block(parent, tokens, data)
        self._children.setdefault(parent, set()).add(key)
        self._bytes += data.numel() * data.element_size()
