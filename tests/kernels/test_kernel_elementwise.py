"""write_kv_cache, rms_norm, rotary_embedding and silu_and_mul against the torch references."""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL
from pagoda.kernels import reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.mark.parametrize(
    ("dtype", "kv_heads", "head_dim", "block_size"),
    [(torch.float16, 2, 128, 16), (torch.bfloat16, 3, 80, 32), (torch.float32, 1, 96, 16)],
    ids=["f16-h2-d128-bs16", "bf16-h3-d80-bs32", "f32-h1-d96-bs16"],
)
def test_write_kv_cache(device, dtype, kv_heads, head_dim, block_size):
    from pagoda.kernels import write_kv_cache

    num_blocks, tokens = 9, 13
    k_cache = torch.randn((num_blocks, block_size, kv_heads, head_dim)).to(device, dtype)
    v_cache = torch.randn_like(k_cache)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[2, 7]] = -1  # padding / already cached: must be left alone
    slots = slots.to(device)
    # k/v as strided views of a fused projection output, as the model produces them
    kv = torch.randn((tokens, 2, kv_heads, head_dim)).to(device, dtype)
    k, v = kv[:, 0], kv[:, 1]
    exp_k, exp_v = k_cache.clone(), v_cache.clone()
    reference.write_kv_cache(k=k, v=v, k_cache=exp_k, v_cache=exp_v, slot_mapping=slots)
    write_kv_cache(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slots)
    assert torch.equal(k_cache, exp_k)
    assert torch.equal(v_cache, exp_v)


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize(
    ("dtype", "hidden"),
    [(torch.float32, 96), (torch.float16, 576), (torch.bfloat16, 1000)],
    ids=["f32-96", "f16-576", "bf16-1000"],
)
def test_rms_norm(device, dtype, hidden, with_residual):
    from pagoda.kernels import rms_norm

    x = torch.randn((5, hidden)).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(hidden)).to(device, dtype)
    residual = torch.randn((5, hidden)).to(device, dtype) if with_residual else None
    got = rms_norm(x=x, weight=weight, eps=1e-5, residual=residual)
    expected = reference.rms_norm(x=x, weight=weight, eps=1e-5, residual=residual)
    if with_residual:
        # x + residual, rounded once to x's dtype: bit-exact, except that Triton 3.9's
        # interpreter truncates fp32 -> bf16 where GPUs round to nearest even (1 ulp).
        if device.type == "cpu" and dtype == torch.bfloat16:
            torch.testing.assert_close(got[1], expected[1], atol=0, rtol=2**-7)
        else:
            assert torch.equal(got[1], expected[1])
        torch.testing.assert_close(got[0], expected[0], **TOL[dtype])
    else:
        torch.testing.assert_close(got, expected, **TOL[dtype])


def test_rms_norm_residual_in_place(device):
    """``residual_out=residual`` updates the residual stream without a new allocation."""
    from pagoda.kernels import rms_norm

    x = torch.randn((3, 64)).to(device, torch.float16)
    weight = torch.randn(64).to(device, torch.float16)
    residual = torch.randn((3, 64)).to(device, torch.float16)
    expected = reference.rms_norm(x=x, weight=weight, eps=1e-6, residual=residual.clone())
    out, new_res = rms_norm(x=x, weight=weight, eps=1e-6, residual=residual, residual_out=residual)
    assert new_res.data_ptr() == residual.data_ptr()
    assert torch.equal(residual, expected[1])
    torch.testing.assert_close(out, expected[0], **TOL[torch.float16])


@pytest.mark.parametrize(
    ("dtype", "is_neox", "head_dim", "rotary_dim"),
    [
        (torch.float32, True, 64, 64),
        (torch.float16, True, 80, 80),
        (torch.bfloat16, False, 128, 128),
        (torch.float16, True, 128, 64),  # partial rotary: dims past 64 untouched
    ],
    ids=["f32-neox-d64", "f16-neox-d80", "bf16-gptj-d128", "f16-neox-partial"],
)
def test_rotary_embedding(device, dtype, is_neox, head_dim, rotary_dim):
    from pagoda.kernels import rotary_embedding

    max_pos, tokens = 2048, 7
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    angles = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1).to(device)
    positions = torch.tensor([0, 1, 5, 17, 1000, 2047, 3], device=device)
    qkv = torch.randn((tokens, 3 + 1 + 1, head_dim)).to(device, dtype)  # 3 q heads, 1 k, 1 v
    q, k = qkv[:, :3], qkv[:, 3:4]
    exp_q, exp_k = q.clone(), k.clone()
    reference.rotary_embedding(
        positions=positions, q=exp_q, k=exp_k, cos_sin_cache=cos_sin, is_neox=is_neox
    )
    untouched_v = qkv[:, 4].clone()
    got = rotary_embedding(positions=positions, q=q, k=k, cos_sin_cache=cos_sin, is_neox=is_neox)
    assert got[0] is q and got[1] is k
    torch.testing.assert_close(q, exp_q, **TOL[dtype])
    torch.testing.assert_close(k, exp_k, **TOL[dtype])
    assert torch.equal(qkv[:, 4], untouched_v)
    if rotary_dim < head_dim:
        assert torch.equal(q[..., rotary_dim:], exp_q[..., rotary_dim:])


@pytest.mark.parametrize(
    ("dtype", "inter"),
    [(torch.float32, 100), (torch.float16, 1536), (torch.bfloat16, 64)],
    ids=["f32-100", "f16-1536", "bf16-64"],
)
def test_silu_and_mul(device, dtype, inter):
    from pagoda.kernels import silu_and_mul

    x = (3 * torch.randn((4, 2 * inter))).to(device, dtype)
    torch.testing.assert_close(silu_and_mul(x=x), reference.silu_and_mul(x=x), **TOL[dtype])


def test_empty_batches_are_no_ops(device):
    from pagoda.kernels import rms_norm, silu_and_mul, write_kv_cache

    cache = torch.zeros((2, 16, 1, 64), device=device)
    empty = torch.empty((0, 1, 64), device=device)
    write_kv_cache(
        k=empty,
        v=empty,
        k_cache=cache,
        v_cache=cache,
        slot_mapping=torch.empty(0, dtype=torch.int64, device=device),
    )
    assert rms_norm(
        x=torch.empty((0, 64), device=device), weight=torch.ones(64, device=device), eps=1e-6
    ).shape == (0, 64)
    assert silu_and_mul(x=torch.empty((0, 8), device=device)).shape == (0, 4)
