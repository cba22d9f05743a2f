"""grouped_sdpa (backends/attention.py): the same attention as transformers' own ``sdpa`` function, which copies
keys and values to every query head (``repeat_kv``) or packs one query position (``pack_gqa``)."""

import pytest
import torch
from lookahead_reasoning.backends.attention import grouped_sdpa
from transformers.integrations.sdpa_attention import sdpa_attention_forward


class Layer(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


def _qkv(rows, heads, kv_heads, width, slots, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, heads, width, dim, generator=gen), torch.randn(rows, kv_heads, slots, dim, generator=gen),
            torch.randn(rows, kv_heads, slots, dim, generator=gen), gen)


@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (3, 1), (4, 4)])
@pytest.mark.parametrize("mask_kind", ["additive", "bool"])
def test_grouped_sdpa_equals_transformers_sdpa_under_a_mask(width, heads, kv_heads, mask_kind):
    rows, slots = 3, 19
    q, k, v, gen = _qkv(rows, heads, kv_heads, width, slots, seed=width * 100 + heads * 10 + kv_heads)
    allowed = torch.rand(rows, 1, width, slots, generator=gen) > 0.3  # holes, as the engine's batch cache has
    allowed[..., -1] = True  # every query sees at least one slot
    mask = (allowed if mask_kind == "bool"
            else torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min))
    layer = Layer(heads // kv_heads)
    got, _ = grouped_sdpa(layer, q, k, v, mask)
    want, _ = sdpa_attention_forward(layer, q, k, v, mask)
    assert got.shape == (rows, width, heads, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("slots", [6, 11])  # as many keys as queries (a prefill), or more (an empty static cache)
def test_grouped_sdpa_without_a_mask_is_causal_from_the_first_key(slots):
    q, k, v, _ = _qkv(2, 8, 2, 6, slots, seed=slots)
    layer = Layer(4)
    got, _ = grouped_sdpa(layer, q, k, v, None)
    want, _ = sdpa_attention_forward(layer, q, k, v, None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # query 0 sees key 0 only, whatever follows it
    k2 = k.clone()
    k2[:, :, 1:] = 0
    torch.testing.assert_close(grouped_sdpa(layer, q, k2, v, None)[0][:, 0], got[:, 0])


@pytest.mark.parametrize("width,is_causal", [(1, None), (4, False)])  # one-position decode; a bidirectional layer
def test_grouped_sdpa_without_a_mask_and_not_causal_sees_every_key(width, is_causal):
    q, k, v, _ = _qkv(2, 8, 2, width, 9, seed=width)
    layer = Layer(4)
    got, _ = grouped_sdpa(layer, q, k, v, None, is_causal=is_causal)
    want, _ = sdpa_attention_forward(layer, q, k, v, None, is_causal=is_causal)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_sdpa_cuts_a_wider_mask_to_the_keys():
    q, k, v, gen = _qkv(2, 8, 2, 3, 7, seed=5)
    allowed = torch.rand(2, 1, 3, 12, generator=gen) > 0.3
    allowed[..., 0] = True
    got, _ = grouped_sdpa(Layer(4), q, k, v, allowed)
    want, _ = sdpa_attention_forward(Layer(4), q, k, v, allowed[..., :7])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_sdpa_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="not a multiple"):
        grouped_sdpa(Layer(1), torch.zeros(1, 6, 1, 8), torch.zeros(1, 4, 5, 8), torch.zeros(1, 4, 5, 8), None)
    with pytest.raises(ValueError, match="shared by all heads"):
        grouped_sdpa(Layer(2), torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8),
                     torch.zeros(1, 4, 1, 5))
    for arg in ("softcap", "position_bias", "s_aux"):
        with pytest.raises(ValueError, match=arg):
            grouped_sdpa(Layer(2), torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8), None,
                         **{arg: torch.zeros(1)})
