"""Activation quantization to FP8 (E4M3), one program per token; and the cast the FP8 kernels share.

``quantize_fp8`` turns ``x [M, K]`` (16/32-bit) into E4M3 codes and a float32 scale, with the
numerics of `pagoda.kernels.fp8.quantize_per_token` bit for bit. A program owns ``ROWS`` rows
(config ``fp8_quant``, keyed by ``hidden`` = K) and walks them in ``BLOCK``-wide slices:

* dynamic (``scale=None``): it reads its rows once for each row's ``amax``, writes each row's
  scale ``max(amax, 1e-12) / 448`` (NaN for a row holding a NaN, as torch's amax), then reads the rows again and writes ``e4m3(x / scale)``;
* static (a one-element ``scale``, a checkpoint's ``input_scale``): every row uses it.

A row's codes depend on that row alone, so the FP8 GEMM behind it stays batch-invariant.

:func:`to_fp8` is the one float32 → E4M3 conversion of the FP8 kernels (here and the KV-cache
write): saturate to ±448, then round to nearest even. On a GPU the cast is the hardware's
(``cvt.rn.satfinite.e4m3x2.f32`` on Hopper). Triton 3.9's interpreter gets that cast wrong (its
mantissa rounding does not carry into the exponent: 31.2 becomes 16), so under
``TRITON_INTERPRET=1`` the value is first rounded onto the E4M3 grid in float32 arithmetic
(exact: adding and removing ``2^(e+20)`` rounds at the E4M3 step ``2^(e-3)``), and the cast then
only re-encodes a representable value, which the interpreter does right.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import check_device, interpreter_enabled, next_pow2
from pagoda.kernels.config import get_kernel_config
from pagoda.kernels.fp8 import AMAX_FLOOR, FP8_DTYPE, FP8_MAX


@triton.jit
def _round_to_e4m3_grid(x):
    """float32 ``x`` (|x| ≤ 448) rounded to the nearest E4M3 value, ties to even, in float32."""
    bits = x.to(tl.int32, bitcast=True)
    exp = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # E4M3: normal exponents from -6
    magic = ((exp + 20 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(exp+20): ulp = 2^(exp-3)
    r = (tl.abs(x) + magic) - magic
    return tl.where(bits < 0, -r, r)  # the sign bit, so -0.0 stays -0.0


@triton.jit
def to_fp8(x, EMULATE_CAST: tl.constexpr):
    """float32 → E4M3: saturate to ±448, round to nearest even (see the module docstring). NaN
    stays NaN (E4M3's NaN code), as torch's cast and ``cvt.rn.satfinite`` give it: a plain
    ``minimum``/``maximum`` returns the other operand for a NaN, which would store -448."""
    x = tl.clamp(x, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    if EMULATE_CAST:  # the interpreter's cast also turns NaN into a number: set NaN's code
        q = _round_to_e4m3_grid(x).to(tl.float8e4nv)
        nan = (tl.zeros(x.shape, tl.uint8) + 0x7F).to(tl.float8e4nv, bitcast=True)
        return tl.where(x != x, nan, q)
    return x.to(tl.float8e4nv)


@triton.jit
def _quantize_rows_kernel(
    x_ptr,  # [M, K] 16/32-bit
    q_ptr,  # [M, K] float8e4nv
    scale_ptr,  # [M] float32 written (DYNAMIC), or [1] float32 read
    M,
    K,
    stride_xm,
    stride_qm,
    DYNAMIC: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    AMAX_MIN: tl.constexpr,
    QMAX: tl.constexpr,
    EMULATE_CAST: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < M
    rows = rows.to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_rows = x_ptr + rows[:, None] * stride_xm  # [ROWS, 1]
    q_rows = q_ptr + rows[:, None] * stride_qm
    if DYNAMIC:
        amax = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        nans = tl.zeros([ROWS, BLOCK], dtype=tl.int32)
        for k0 in range(0, K, BLOCK):
            mask = row_mask[:, None] & (offs[None, :] < K - k0)
            x = tl.load(x_rows + k0 + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
            nans += (x != x).to(tl.int32)
        scale = tl.div_rn(tl.maximum(tl.max(amax, axis=1), AMAX_MIN), QMAX)  # [ROWS]
        # a row with a NaN has a NaN amax in torch (the reference): its scale and codes are NaN,
        # not the other values' scale with the NaN stored as a number (max drops a NaN)
        scale = tl.where(tl.sum(nans, axis=1) > 0, float("nan"), scale)
        tl.store(scale_ptr + rows, scale, mask=row_mask)
    else:
        scale = tl.zeros([ROWS], dtype=tl.float32) + tl.load(scale_ptr)
    for k0 in range(0, K, BLOCK):
        mask = row_mask[:, None] & (offs[None, :] < K - k0)
        x = tl.load(x_rows + k0 + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        q = to_fp8(tl.div_rn(x, scale[:, None]), EMULATE_CAST)
        tl.store(q_rows + k0 + offs[None, :], q, mask=mask)


def quantize_fp8(
    *,
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (float32/float16/bfloat16, rows contiguous) → (E4M3 ``[M, K]``, scale).

    ``scale=None``: dynamic, one float32 scale per row (``[M]``, into ``out_scale`` if given).
    A one-element float32 ``scale``: static, returned as the scale. Graph-capturable: no host
    reads; ``out``/``out_scale`` may be preallocated."""
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x must be 2-D float32/float16/bfloat16, got {tuple(x.shape)} {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError("the K dimension of x must be contiguous")
    M, K = x.shape
    if scale is not None and (scale.dtype != torch.float32 or scale.numel() != 1):
        raise ValueError(f"a static scale is one float32 element, got {tuple(scale.shape)} "
                         f"{scale.dtype}")  # fmt: skip
    if out is None:
        out = torch.empty((M, K), dtype=FP8_DTYPE, device=x.device)
    elif out.shape != (M, K) or out.dtype != FP8_DTYPE or out.stride(1) != 1:
        raise ValueError(f"out must be [{M}, {K}] float8_e4m3fn with contiguous rows")
    if scale is None:
        if out_scale is None:
            out_scale = torch.empty(M, dtype=torch.float32, device=x.device)
        elif out_scale.shape != (M,) or out_scale.dtype != torch.float32:
            raise ValueError(f"out_scale must be float32 [{M}]")
    result_scale = out_scale if scale is None else scale
    device = check_device(x, out, result_scale)
    if M == 0:
        return out, result_scale
    cfg = get_kernel_config("fp8_quant", {"hidden": K}, device)
    rows = int(cfg["ROWS"])
    _quantize_rows_kernel[(triton.cdiv(M, rows),)](
        x,
        out,
        result_scale,
        M,
        K,
        x.stride(0),
        out.stride(0),
        DYNAMIC=scale is None,
        ROWS=rows,
        BLOCK=min(next_pow2(max(K, 16)), int(cfg["BLOCK"])),
        AMAX_MIN=AMAX_FLOOR,
        QMAX=FP8_MAX,
        EMULATE_CAST=interpreter_enabled(),
        num_warps=int(cfg["num_warps"]),
    )
    return out, result_scale
