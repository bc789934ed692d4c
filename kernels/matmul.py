"""Batch-invariant ``x @ weight.T (+ bias)``: a row's result does not depend on the other rows.

cuBLAS picks its kernel (tile shape, split-K, tensor-core instruction) from M, so the same row
rounds differently in a decode step of 8 sequences, one of 256, a CUDA graph padded to 264 or a
prefill chunk: greedy output then depends on what else is in the batch and on the prefix cache
(docs/runtime.md, "What is guaranteed"). This kernel fixes everything that decides the order of
the K reduction from ``(N, K)`` alone: one launch config per weight shape, every program walks K
from 0 in ``BLOCK_K`` steps into one fp32 accumulator, no split-K. M only changes the grid.

Small M gets parallelism from narrow N tiles instead of split-K (which would change the order);
programs are ordered in groups of ``GROUP_M`` row tiles so a weight tile is reused from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, fit_stages
from pagoda.kernels.attn_common import dot_precision, mma
from pagoda.kernels.config import get_kernel_config
from pagoda.kernels.config_schema import check_launch_config


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    a_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N] or a dummy pointer when HAS_BIAS is False
    c_ptr,  # [M, N]
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_cm,
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
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = (
        w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    )  # [BLOCK_K, BLOCK_N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc += mma(a, w, DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _validate(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"expected x [M, K] and weight [N, K]; got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if x.dtype != weight.dtype:
        raise ValueError(f"x and weight dtypes differ: {x.dtype} vs {weight.dtype}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("the K dimension of x and weight must be contiguous")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"bias must be contiguous [N={weight.shape[0]}], got {tuple(bias.shape)}")


def linear(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T + bias`` in x's dtype, fp32 accumulation; batch-invariant.

    ``config`` overrides the launch config (tuning sweeps); any fixed config is invariant."""
    _validate(x, weight, bias)
    device = check_device(x, weight, *(t for t in (bias, out) if t is not None))
    M, K = x.shape
    N = weight.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif out.shape != (M, N) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{M}, {N}] {x.dtype} with contiguous rows")
    if M == 0:
        return out
    if config is not None:
        check_launch_config("matmul", config)
    cfg = config or get_kernel_config("matmul", {"n": N, "k": K}, device)
    bm, bn, bk = int(cfg["BLOCK_M"]), int(cfg["BLOCK_N"]), int(cfg["BLOCK_K"])
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _matmul_kernel[grid](
        x,
        weight,
        bias if bias is not None else out,
        out,
        M,
        N,
        K,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=int(cfg["GROUP_M"]),
        DOT_PRECISION=dot_precision(x.dtype),
        num_warps=int(cfg["num_warps"]),
        num_stages=fit_stages(int(cfg["num_stages"]), (bm + bn) * bk * x.element_size(), device),
    )
    return out
