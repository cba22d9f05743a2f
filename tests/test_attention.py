"""grouped_sdpa (backends/attention.py): the same attention as sdpa over keys/values copied to every head."""

import pytest
import torch

from lookahead_reasoning.backends.attention import grouped_sdpa


def reference(q, k, v, mask, causal):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # transformers' repeat_kv
    if mask is None and causal and q.shape[2] > 1:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


class Layer(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (3, 1), (4, 4)])
@pytest.mark.parametrize("mask_kind", ["additive", "bool", "none"])
def test_grouped_sdpa_equals_sdpa_with_copied_kv(width, heads, kv_heads, mask_kind):
    gen = torch.Generator().manual_seed(width * 100 + heads * 10 + kv_heads)
    rows, slots, dim = 3, 19, 16
    q = torch.randn(rows, heads, width, dim, generator=gen)
    k = torch.randn(rows, kv_heads, slots, dim, generator=gen)
    v = torch.randn(rows, kv_heads, slots, dim, generator=gen)
    allowed = torch.rand(rows, 1, width, slots, generator=gen) > 0.3  # holes, as the engine's batch cache has
    allowed[..., -1] = True  # every query sees at least one slot
    mask = {"bool": allowed, "none": None,
            "additive": torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)}[mask_kind]
    got, _ = grouped_sdpa(Layer(), q, k, v, mask)
    assert got.shape == (rows, width, heads, dim)
    torch.testing.assert_close(got, reference(q, k, v, mask, causal=True), rtol=1e-5, atol=1e-5)


def test_grouped_sdpa_rejects_heads_that_do_not_group():
    q, k = torch.zeros(1, 6, 1, 8), torch.zeros(1, 4, 5, 8)
    with pytest.raises(ValueError, match="not a multiple"):
        grouped_sdpa(Layer(), q, k, k, None)
    with pytest.raises(ValueError, match="shared by all heads"):
        grouped_sdpa(Layer(), torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8),
                     torch.zeros(1, 4, 1, 5))
