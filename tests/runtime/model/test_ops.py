"""The PyTorch rotary embedding rounds exactly as Hugging Face's, on the joint and split paths."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model.ops import build_cos_sin_cache, gather_cos_sin, rotary_embedding


def _hf_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, its cos and sin being
    our halves repeated ([T, 1, D/2] → [T, 1, D])."""
    cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 5, 64])
def test_rotary_in_place_on_fused_qkv_matches_hf(dtype, tokens):
    heads, kv_heads, d = 9, 3, 64
    torch.manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d).to(dtype)
    positions = torch.randint(0, 4096, (tokens,))
    cs = gather_cos_sin(positions, build_cos_sin_cache(d, 10000.0, None, 4096), dtype)
    cos, sin = (t.unsqueeze(1) for t in cs.chunk(2, dim=-1))
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k = q.reshape(tokens, heads, d), k.reshape(tokens, kv_heads, d)
    want_q, want_k, want_v = _hf_rotary(q, cos, sin), _hf_rotary(k, cos, sin), v.clone()

    got_q, got_k = rotary_embedding(positions=None, q=q, k=k, cos_sin_cache=cs)
    assert got_q is q and got_k is k  # rotated in place, inside the fused projection
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(v, want_v)  # v is left alone

    # Separate (non-adjacent) tensors take the per-tensor path, with the same bits.
    sep_q = torch.randn(tokens, heads, d).to(dtype)
    sep_k = torch.randn(tokens, kv_heads, d).to(dtype)
    expect_q, expect_k = _hf_rotary(sep_q, cos, sin), _hf_rotary(sep_k, cos, sin)
    cache = build_cos_sin_cache(d, 10000.0, None, 4096)
    rotary_embedding(positions=positions, q=sep_q, k=sep_k, cos_sin_cache=cache)
    assert torch.equal(sep_q, expect_q) and torch.equal(sep_k, expect_k)
