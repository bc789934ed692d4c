"""Batch-invariant FP8 GEMM: ``(x · x_scale) @ (weight · weight_scale).T (+ bias)`` → 16-bit.

``weight`` is E4M3 ``[N, K]`` with a float32 scale per output channel (``[N]``) or per tensor
(one element). ``x`` is either

* E4M3 ``[M, K]`` with its float32 scale per token (``[M]``) or per tensor (one element);
* 16/32-bit: quantized per token first (`pagoda.kernels.fp8_quant.quantize_fp8`, dynamic) or
  with a static per-tensor ``x_scale``, then multiplied as above (W8A8);
* 16/32-bit with ``weight_only=True``: not quantized; each weight tile is widened to x's dtype
  (exact: every E4M3 value is a bfloat16/float16 value) and multiplied on the 16-bit tensor
  cores (W8A16, for weight-only checkpoints and GPUs without FP8 tensor cores).

Products accumulate in float32. The scales are applied once, in the epilogue:
``acc[m, n] · x_scale[m] · weight_scale[n]``, then the bias, then one rounding to the output
dtype. On Hopper, ``tl.dot`` of two FP8 tiles accumulates inside the tensor core with fewer
than float32's bits; ``max_num_imprecise_acc=BLOCK_K`` makes each ``BLOCK_K`` slice of K start
from zero there and be added to the float32 accumulator (DeepSeek-V3's promotion interval).

Batch invariance, as in `pagoda.kernels.matmul`: the launch config comes from the weight's
``(N, K)`` alone (kernel ``fp8_matmul`` in ``configs/``); every program walks K from 0 in
``BLOCK_K`` steps into its own accumulator; no split-K. M only changes the grid, and a token's
activation scale depends on that token alone. So a row's bits do not depend on the rest of the
batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, fit_stages
from pagoda.kernels.attn_common import dot_precision, mma
from pagoda.kernels.config import get_kernel_config
from pagoda.kernels.config_schema import check_launch_config
from pagoda.kernels.fp8 import FP8_DTYPE
from pagoda.kernels.fp8_quant import quantize_fp8

MIN_BLOCK_K = 32  # FP8 MMA instructions take K in steps of 32


@triton.jit(do_not_specialize=["M"])
def _fp8_matmul_kernel(
    a_ptr,  # [M, K] float8e4nv (A_FP8) or 16/32-bit (weight-only)
    a_scale_ptr,  # [M] or [1] float32 (stride_as 1 or 0); unused without A_FP8
    w_ptr,  # [N, K] float8e4nv
    w_scale_ptr,  # [N] or [1] float32 (stride_ws 1 or 0)
    bias_ptr,  # [N] or a dummy pointer when HAS_BIAS is False
    c_ptr,  # [M, N]
    M,
    N,
    K,
    stride_am,
    stride_as,
    stride_wn,
    stride_ws,
    stride_cm,
    A_FP8: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]  # [BM, BK]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if A_FP8:
            acc += tl.dot(a, w, max_num_imprecise_acc=BLOCK_K)
        else:
            acc += mma(a, w.to(a.dtype), DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if A_FP8:
        a_s = tl.load(a_scale_ptr + offs_m * stride_as, mask=m_mask, other=0.0)
        acc = acc * a_s[:, None]
    w_s = tl.load(w_scale_ptr + offs_n * stride_ws, mask=n_mask, other=0.0)
    acc = acc * w_s[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _scale_stride(name: str, scale: torch.Tensor, rows: int) -> int:
    """0 for a per-tensor scale (one element), 1 for one per row; anything else is refused."""
    if scale.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {scale.dtype}")
    if scale.numel() == 1:
        return 0
    if scale.numel() == rows and scale.dim() in (1, 2) and scale.is_contiguous():
        return 1
    raise ValueError(
        f"{name} must have 1 or {rows} elements (contiguous), got {tuple(scale.shape)}"
    )


def _validate(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weight_only: bool
) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"expected x [M, K] and weight [N, K]; got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if weight.dtype != FP8_DTYPE:
        raise ValueError(f"weight must be float8_e4m3fn, got {weight.dtype}")
    if x.dtype not in (FP8_DTYPE, torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be float8_e4m3fn, bfloat16, float16 or float32, got {x.dtype}")
    if weight_only and x.dtype == FP8_DTYPE:
        raise ValueError("weight_only takes 16/32-bit activations, got float8_e4m3fn")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("the K dimension of x and weight must be contiguous")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"bias must be contiguous [N={weight.shape[0]}], got {tuple(bias.shape)}")


def fp8_linear(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    x_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    weight_only: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """``x [M, K]`` times E4M3 ``weight [N, K]`` (scaled) → ``[M, N]``; batch-invariant.

    ``x``: E4M3 with ``x_scale`` (``[M]`` or one element), or 16/32-bit, quantized per token
    (``x_scale=None``), with a static ``x_scale`` (one element), or left as it is with
    ``weight_only``. ``weight_scale``: ``[N]`` or one element, float32. ``out_dtype``: default
    x's dtype, bfloat16 for E4M3 ``x``. ``config`` overrides the launch config (tuning sweeps).
    No host syncs: graph-capturable."""
    _validate(x, weight, bias, weight_only)
    M, K = x.shape
    N = weight.shape[0]
    stride_ws = _scale_stride("weight_scale", weight_scale, N)
    if weight_only:
        if x_scale is not None:
            raise ValueError("weight_only: x is not quantized, so it takes no x_scale")
        a, a_scale, stride_as = x, weight_scale, 0  # a_scale is not read
    elif x.dtype == FP8_DTYPE:
        if x_scale is None:
            raise ValueError("float8_e4m3fn x needs its x_scale ([M] or one element)")
        a, a_scale, stride_as = x, x_scale, _scale_stride("x_scale", x_scale, M)
    else:
        a, a_scale = quantize_fp8(x=x, scale=x_scale)
        stride_as = _scale_stride("x_scale", a_scale, M)
    out_dtype = out_dtype or (torch.bfloat16 if x.dtype == FP8_DTYPE else x.dtype)
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=x.device)
    elif out.shape != (M, N) or out.dtype != out_dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{M}, {N}] {out_dtype} with contiguous rows")
    device = check_device(
        a, weight, weight_scale, a_scale, out, *([bias] if bias is not None else [])
    )
    if M == 0:
        return out
    if config is not None:
        check_launch_config("fp8_matmul", config)
    cfg = config or get_kernel_config("fp8_matmul", {"n": N, "k": K}, device)
    bm, bn, bk = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"]), int(cfg["BLOCK_K"])
    if min(bm, bn) < 16 or bk < MIN_BLOCK_K:
        raise ValueError(f"fp8_matmul config needs BLOCK_M, BLOCK_N >= 16 and BLOCK_K >= "
                         f"{MIN_BLOCK_K}, got {cfg}")  # fmt: skip
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _fp8_matmul_kernel[grid](
        a,
        a_scale,
        weight,
        weight_scale,
        bias if bias is not None else out,
        out,
        M,
        N,
        K,
        a.stride(0),
        stride_as,
        weight.stride(0),
        stride_ws,
        out.stride(0),
        A_FP8=a.dtype == FP8_DTYPE,
        HAS_BIAS=bias is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=int(cfg["GROUP_M"]),
        DOT_PRECISION=dot_precision(a.dtype),
        num_warps=int(cfg["num_warps"]),
        num_stages=fit_stages(int(cfg["num_stages"]), (bm + bn) * bk * a.element_size(), device),
    )
    return out
