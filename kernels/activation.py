"""Fused SiLU-and-multiply for gated MLPs: ``silu(x[:, :I]) * x[:, I:]`` in one pass."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, next_pow2
from pagoda.kernels.config import get_kernel_config


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,  # [T, I]
    x_ptr,  # [T, 2 * I]: gate then up
    stride_out,
    stride_x,
    I: tl.constexpr,  # noqa: E741 - the usual name for the intermediate size
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(*, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` ``[T, 2*I]`` → ``out`` ``[T, I]`` = ``silu(x[:, :I]) * x[:, I:]`` (float32 math)."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"expected x [T, 2*I] with contiguous rows, got {tuple(x.shape)}")
    num_rows, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((num_rows, inter), dtype=x.dtype, device=x.device)
    if out.shape != (num_rows, inter) or out.stride(1) != 1:
        raise ValueError(f"out must be [T, I] = {(num_rows, inter)}, got {tuple(out.shape)}")
    check_device(x, out)
    if num_rows == 0 or inter == 0:
        return out
    cfg = get_kernel_config("silu_and_mul", {"intermediate": inter}, x.device)
    block = min(int(cfg["BLOCK"]), next_pow2(inter))
    _silu_and_mul_kernel[(num_rows, triton.cdiv(inter, block))](
        out, x, out.stride(0), x.stride(0), I=inter, BLOCK=block, num_warps=int(cfg["num_warps"])
    )
    return out
