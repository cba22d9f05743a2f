"""Grouped-query attention without copying keys and values: ``grouped_sdpa``.

transformers' ``sdpa`` attention, given an explicit mask on CUDA, expands grouped-query keys and values to every
query head (``repeat_kv``) before calling ``scaled_dot_product_attention``; newer releases avoid the copy only for
one query position (``pack_gqa``). The portable engine's GPU mode always passes a mask over every slot of its
static cache, so each layer copies ``rows x heads x capacity x head_dim`` keys and values per step: on a
random-weight Qwen3-32B shape on an H200 (64 query / 8 KV heads, 4,352 slots) a decoding step took 37.6 ms for
one row and 71.2 ms for four (benchmarks/RESULTS.md, GPU path), where the weights alone bound it near-flat.

``grouped_sdpa`` folds the ``g = heads / kv_heads`` query heads that share a KV head into the query-position axis
instead: ``[rows, kv_heads, g * width, head_dim]`` queries against the unexpanded ``[rows, kv_heads, slots,
head_dim]`` keys and values, the mask repeated ``g`` times along its query axis. The result is the same attention
(each query head still attends with its own query to its group's keys; PyTorch ``scaled_dot_product_attention``
docs, ``enable_gqa``), computed without the copy, at any width (speculative verification too).
Registered with transformers' ``AttentionInterface`` (transformers docs, "Attention Interface").
"""

from __future__ import annotations

import torch

NAME = "grouped_sdpa"


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` ``[rows, heads, width, head_dim]`` over ``key``/``value`` ``[rows, kv_heads, slots,
    head_dim]`` under an additive or boolean ``attention_mask`` ``[rows, 1, width, >= slots]`` (cut to ``slots``),
    or with None: causal when ``width > 1``, aligned as SDPA's ``is_causal`` (query ``i`` sees keys ``0..i``: a
    prefill into an empty cache, the one case transformers passes no mask with keys beyond the queries).
    Returns ``([rows, width, heads, head_dim], None)`` in the query's dtype, the signature transformers'
    attention functions share.

    Raises:
        ValueError: ``heads`` is not a multiple of ``kv_heads``; the mask has per-head rows; ``softcap``,
            ``position_bias`` or ``s_aux`` (attention sinks) is set.
    """
    for arg in ("softcap", "position_bias", "s_aux"):  # transformers' extras this function does not apply
        if kwargs.get(arg) is not None:
            raise ValueError(f"grouped_sdpa: {arg} is not supported (use sdpa or eager attention)")
    rows, heads, width, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise ValueError(f"grouped_sdpa: {heads} query heads are not a multiple of {kv_heads} KV heads")
    g = heads // kv_heads
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if attention_mask is None and causal and width > 1:  # explicit: positions fold with the heads below
        attention_mask = torch.ones((width, slots), dtype=torch.bool, device=query.device).tril()[None, None]
    if attention_mask is not None:
        if attention_mask.shape[1] != 1:
            raise ValueError("grouped_sdpa: the mask must be shared by all heads ([rows, 1, width, slots])")
        attention_mask = attention_mask[..., :slots]
    if g > 1:
        query = query.reshape(rows, kv_heads, g * width, dim)
        if attention_mask is not None:
            attention_mask = attention_mask.repeat(1, 1, g, 1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False)
    return out.reshape(rows, heads, width, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :func:`grouped_sdpa` with transformers (idempotent); returns its name for
    ``attn_implementation``. Its masks are built as ``sdpa``'s (transformers ``AttentionMaskInterface``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
