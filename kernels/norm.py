"""Fused RMSNorm, optionally with the residual add in front (vLLM ``fused_add_rms_norm``).

One program per row; the whole row sits in registers, so the residual add, the sum of squares
and the scaling read the input once. Sums are float32 whatever the storage dtype; rounding
follows Hugging Face Llama (normalise, round, then multiply by the weight).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, next_pow2
from pagoda.kernels.config import get_kernel_config


@triton.jit
def _rms_norm_kernel(
    out_ptr,  # [T, N]
    x_ptr,  # [T, N]
    weight_ptr,  # [N]
    residual_ptr,  # [T, N] (read when HAS_RESIDUAL)
    new_residual_ptr,  # [T, N] x + residual (written when HAS_RESIDUAL)
    eps,
    stride_out,
    stride_x,
    stride_res,
    stride_new_res,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_N]
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_res + offs, mask=mask, other=0.0).to(tl.float32)
        # Round the sum to the storage dtype first: the norm sees exactly the stored residual.
        summed = (x + r).to(new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_new_res + offs, summed, mask=mask)
        x = summed.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    # As Hugging Face Llama: round the normalised row to the storage dtype, then scale by the
    # weight. A product of two 16-bit floats is exact in fp32, so rounding once at the store
    # equals a native 16-bit multiply (and the interpreter, which lacks bf16 maths, agrees).
    normed = (x * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + row * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask
    )


def rms_norm(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``(x * rsqrt(mean(x²) + eps)).to(dtype) * weight`` over the last dim of ``x`` ``[T, N]``.

    With ``residual`` (``[T, N]``): ``new_residual = x + residual`` (stored in x's dtype) and
    ``out = rms_norm(new_residual)``; returns ``(out, new_residual)``. ``out``/``residual_out``
    may be preallocated (``residual_out=residual`` updates the residual in place).
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"expected x [T, N] and weight [N]; got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    if x.stride(1) != 1:
        raise ValueError("rows of x must be contiguous")
    num_rows, n = x.shape
    if out is None:
        out = torch.empty((num_rows, n), dtype=x.dtype, device=x.device)
    has_residual = residual is not None
    if has_residual:
        if residual.shape != x.shape or residual.stride(1) != 1:
            raise ValueError(f"residual must be [T, N] like x, got {tuple(residual.shape)}")
        if residual_out is None:
            residual_out = torch.empty((num_rows, n), dtype=x.dtype, device=x.device)
        res_in, res_out = residual, residual_out
    else:
        res_in = res_out = x  # unused by the kernel
    check_device(x, weight, out, res_in, res_out)
    if num_rows > 0:
        cfg = get_kernel_config("rms_norm", {"hidden": n}, x.device)
        _rms_norm_kernel[(num_rows,)](
            out,
            x,
            weight,
            res_in,
            res_out,
            float(eps),
            out.stride(0),
            x.stride(0),
            res_in.stride(0),
            res_out.stride(0),
            N=n,
            BLOCK_N=next_pow2(n),
            HAS_RESIDUAL=has_residual,
            num_warps=int(cfg["num_warps"]),
        )
    return (out, residual_out) if has_residual else out
