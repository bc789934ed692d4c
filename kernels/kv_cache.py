"""Scatter a step's new K/V rows into the paged cache by slot mapping.

One program per token copies all its KV heads; a slot of -1 (padding, or a token whose K/V is
already cached) is skipped on the device, so the launch needs no host-side filtering.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, next_pow2
from pagoda.kernels.config import get_kernel_config


@triton.jit
def _write_kv_kernel(
    k_ptr,  # [num_tokens, NUM_KV_HEADS, HEAD_DIM]
    v_ptr,  # [num_tokens, NUM_KV_HEADS, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM]
    slot_mapping_ptr,  # [num_tokens] int64, block * BLOCK_SIZE + offset, -1 = skip
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kc_blk,
    stride_kc_tok,
    stride_kc_head,
    stride_vc_blk,
    stride_vc_tok,
    stride_vc_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    in_blk = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_HEADS)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_HEADS, BLOCK_D]
    src_k = k_ptr + tok * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :]
    src_v = v_ptr + tok * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :]
    dst_k = (
        k_cache_ptr
        + blk * stride_kc_blk
        + in_blk * stride_kc_tok
        + offs_h[:, None] * stride_kc_head
        + offs_d[None, :]
    )
    dst_v = (
        v_cache_ptr
        + blk * stride_vc_blk
        + in_blk * stride_vc_tok
        + offs_h[:, None] * stride_vc_head
        + offs_d[None, :]
    )
    tl.store(dst_k, tl.load(src_k, mask=mask).to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_v, tl.load(src_v, mask=mask).to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In place: ``k_cache.view(-1, Hkv, D)[slot_mapping[i]] = k[i]`` (same for v), -1 skipped.

    Shapes: ``k``/``v`` ``[T, Hkv, D]`` (head dim contiguous); caches
    ``[num_blocks, block_size, Hkv, D]``; ``slot_mapping`` int64 ``[T]``.
    """
    if k.dim() != 3 or k.shape != v.shape or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected k/v [T, Hkv, D] and caches [blocks, block_size, Hkv, D]; got "
            f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k {tuple(k.shape)} does not fit cache {tuple(k_cache.shape)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping must be [T={k.shape[0]}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"slot_mapping must be an integer tensor, got {slot_mapping.dtype}")
    if k.stride(2) != 1 or v.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the head dimension of k, v and the caches must be contiguous")
    device = check_device(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    cfg = get_kernel_config("write_kv_cache", {"row": num_kv_heads * head_dim}, device)
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_HEADS=next_pow2(num_kv_heads),
        BLOCK_D=next_pow2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
        num_warps=int(cfg["num_warps"]),
    )
