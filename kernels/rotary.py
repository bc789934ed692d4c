"""Rotary position embedding applied in place to q and k, one program per token.

``cos_sin_cache`` follows vLLM: row ``p`` is ``cat(cos(p·θ), sin(p·θ))`` over ``rotary_dim / 2``
frequencies. NeoX style (HF Llama) rotates the two halves of the first ``rotary_dim`` dims;
GPT-J style rotates interleaved pairs. Dims beyond ``rotary_dim`` are left untouched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, next_pow2
from pagoda.kernels.config import get_kernel_config


@triton.jit
def _rotate_heads(
    base_ptr,  # this token's row: [NUM_H, HEAD_DIM] with head stride `stride_head`
    stride_head,
    idx1,  # [HALF_PADDED] first element of each rotated pair
    idx2,  # [HALF_PADDED] second element of each rotated pair
    rot_mask,  # [HALF_PADDED]
    cos,  # [HALF_PADDED] float32
    sin,  # [HALF_PADDED] float32
    NUM_H: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_h < NUM_H)[:, None] & rot_mask[None, :]  # [BLOCK_H, HALF_PADDED]
    p1 = base_ptr + offs_h[:, None] * stride_head + idx1[None, :]
    p2 = base_ptr + offs_h[:, None] * stride_head + idx2[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(p1, out1.to(base_ptr.dtype.element_ty), mask=mask)
    tl.store(p2, out2.to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,  # [T, NUM_HEADS, HEAD_DIM], rotated in place
    k_ptr,  # [T, NUM_KV_HEADS, HEAD_DIM], rotated in place
    cos_sin_ptr,  # [max_pos, 2 * HALF]: cos then sin
    positions_ptr,  # [T] int32/int64
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cs,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PADDED: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    offs_r = tl.arange(0, HALF_PADDED)
    rot_mask = offs_r < HALF
    cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_r, mask=rot_mask, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_r, mask=rot_mask, other=0.0).to(
        tl.float32
    )
    if IS_NEOX:
        idx1 = offs_r
        idx2 = offs_r + HALF
    else:
        idx1 = 2 * offs_r
        idx2 = 2 * offs_r + 1
    _rotate_heads(
        q_ptr + tok * stride_q_tok,
        stride_q_head,
        idx1,
        idx2,
        rot_mask,
        cos,
        sin,
        NUM_HEADS,
        BLOCK_HQ,
    )
    _rotate_heads(
        k_ptr + tok * stride_k_tok,
        stride_k_head,
        idx1,
        idx2,
        rot_mask,
        cos,
        sin,
        NUM_KV_HEADS,
        BLOCK_HK,
    )


def rotary_embedding(
    *,
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` ``[T, H, D]`` and ``k`` ``[T, Hkv, D]`` in place by ``positions`` ``[T]``;
    returns ``(q, k)`` for callers that chain (the model's torch op does).

    ``cos_sin_cache`` is ``[max_pos, rotary_dim]`` with ``rotary_dim <= D`` (even); the caller
    guarantees positions < max_pos (no device-side check: that would need a sync to report).
    """
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"expected q [T, H, D] and k [T, Hkv, D]; got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if positions.shape != (q.shape[0],) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be an integer tensor [T], got {tuple(positions.shape)}")
    rotary_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rotary_dim % 2 or rotary_dim > q.shape[2]:
        raise ValueError(f"cos_sin_cache must be [max_pos, rotary_dim <= {q.shape[2]}], even dim")
    if q.stride(2) != 1 or k.stride(2) != 1 or cos_sin_cache.stride(1) != 1:
        raise ValueError("the head dimension of q, k and cos_sin_cache must be contiguous")
    check_device(positions, q, k, cos_sin_cache)
    num_tokens, num_heads, _ = q.shape
    if num_tokens == 0:
        return q, k
    half = rotary_dim // 2
    cfg = get_kernel_config(
        "rotary_embedding", {"heads": num_heads, "rotary_dim": rotary_dim}, q.device
    )
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        cos_sin_cache,
        positions,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=k.shape[1],
        HALF=half,
        HALF_PADDED=next_pow2(half),
        BLOCK_HQ=next_pow2(num_heads),
        BLOCK_HK=next_pow2(k.shape[1]),
        IS_NEOX=bool(is_neox),
        num_warps=int(cfg["num_warps"]),
    )
    return q, k
