"""Scatter a step's new K/V rows into the paged cache by slot mapping.

One program per token copies all its KV heads; a slot of -1 (padding, or a token whose K/V is
already cached) is skipped on the device, so the launch needs no host-side filtering.

An FP8 cache (``float8_e4m3fn``, ``--kv-cache-dtype fp8``) stores ``e4m3(row / scale)``: one
float32 scale per tensor (one element) or per KV head (``[Hkv]``), separate for K and V, divided
in IEEE float32 and converted by `pagoda.kernels.fp8_quant.to_fp8` (saturate to ±448, nearest
even), bit for bit `pagoda.kernels.fp8.write_kv_cache`. Readers multiply by the same scales.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, interpreter_enabled, next_pow2
from pagoda.kernels.config import get_kernel_config
from pagoda.kernels.fp8 import FP8_DTYPE
from pagoda.kernels.fp8_quant import to_fp8


@triton.jit
def _write_kv_kernel(
    k_ptr,  # [num_tokens, NUM_KV_HEADS, HEAD_DIM]
    v_ptr,  # [num_tokens, NUM_KV_HEADS, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM]
    slot_mapping_ptr,  # [num_tokens] int64, block * BLOCK_SIZE + offset, -1 = skip
    k_scale_ptr,  # [Hkv] or [1] float32 (stride_scale 1 or 0), read when QUANTIZE
    v_scale_ptr,  # [Hkv] or [1] float32
    stride_scale,
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
    QUANTIZE: tl.constexpr,
    EMULATE_CAST: tl.constexpr,
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
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    if QUANTIZE:
        head_mask = offs_h < NUM_KV_HEADS
        k_s = tl.load(k_scale_ptr + offs_h * stride_scale, mask=head_mask, other=1.0)
        v_s = tl.load(v_scale_ptr + offs_h * stride_scale, mask=head_mask, other=1.0)
        k = to_fp8(tl.div_rn(k.to(tl.float32), k_s[:, None]), EMULATE_CAST)
        v = to_fp8(tl.div_rn(v.to(tl.float32), v_s[:, None]), EMULATE_CAST)
    tl.store(dst_k, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_v, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """In place: ``k_cache.view(-1, Hkv, D)[slot_mapping[i]] = k[i]`` (same for v), -1 skipped.

    Shapes: ``k``/``v`` ``[T, Hkv, D]`` (head dim contiguous); caches
    ``[num_blocks, block_size, Hkv, D]``; ``slot_mapping`` int64 ``[T]``. A ``float8_e4m3fn``
    cache needs ``k_scale``/``v_scale``: float32, one element or ``[Hkv]`` (module docstring).
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
    num_tokens, num_kv_heads, head_dim = k.shape
    quantize = k_cache.dtype == FP8_DTYPE
    stride_scale = _kv_scale_stride(k_cache, v_cache, k_scale, v_scale, num_kv_heads)
    scales = (k_scale, v_scale) if quantize else (slot_mapping, slot_mapping)  # not read
    device = check_device(k, v, k_cache, v_cache, slot_mapping, *scales)
    if num_tokens == 0:
        return
    cfg = get_kernel_config("write_kv_cache", {"row": num_kv_heads * head_dim}, device)
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        scales[0],
        scales[1],
        stride_scale,
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
        QUANTIZE=quantize,
        EMULATE_CAST=quantize and interpreter_enabled(),
        num_warps=int(cfg["num_warps"]),
    )


def _kv_scale_stride(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    num_kv_heads: int,
) -> int:
    """0 for per-tensor scales, 1 for per-head ones; scales only (and always) with FP8 caches."""
    if (k_cache.dtype == FP8_DTYPE) != (v_cache.dtype == FP8_DTYPE):
        raise ValueError(f"k_cache and v_cache dtypes differ: {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.dtype != FP8_DTYPE:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale/v_scale are for float8_e4m3fn caches, not {k_cache.dtype}")
        return 0
    if k_scale is None or v_scale is None:
        raise ValueError("a float8_e4m3fn KV cache needs k_scale and v_scale")
    sizes = {s.numel() for s in (k_scale, v_scale)}
    if (
        any(s.dtype != torch.float32 or not s.is_contiguous() for s in (k_scale, v_scale))
        or len(sizes) != 1
        or sizes.isdisjoint({1, num_kv_heads})
    ):
        raise ValueError(
            f"k_scale and v_scale must be contiguous float32 with 1 or Hkv={num_kv_heads} "
            f"elements each, got {tuple(k_scale.shape)} {k_scale.dtype}, "
            f"{tuple(v_scale.shape)} {v_scale.dtype}"
        )
    return 0 if sizes == {1} else 1
