"""FP8 (E4M3) numerics in PyTorch: scales, quantization, and the references of the FP8 kernels.

Format: ``torch.float8_e4m3fn`` (OCP E4M3 "fn": no infinities, one NaN code per sign, largest
finite value 448, smallest subnormal 2⁻⁹, 3 mantissa bits). A value ``x`` is stored as
``q = e4m3(x / scale)`` and read back as ``q · scale``:

* ``scale = max(amax, AMAX_FLOOR) / 448`` in float32 (IEEE division), where ``amax`` is the
  largest ``|x|`` of the group the scale covers: one output channel (a weight row), one token
  (an activation row), one KV head or a whole tensor. The floor gives an all-zero group a
  finite positive scale, so it stores zeros and reads back zeros.
* ``x / scale`` is computed in float32 (IEEE division), saturated to ±448, then rounded to
  nearest, ties to even, by torch's cast. A value that is an E4M3 value times ``scale`` comes
  back exactly; every other comes back within half an E4M3 step (relative 2⁻⁴ for normal
  values) times ``scale``.

This module needs no Triton (like `pagoda.kernels.reference`). The functions named like the
launchers (``quantize_fp8``, ``fp8_linear``, ``write_kv_cache``, ``paged_attention``) are the
references of the Triton kernels with the same signatures: the tests hold the two against each
other, and these against a float64 implementation of E4M3 rounding.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
AMAX_FLOOR = 1e-12  # scale floor: an all-zero group gets scale 1e-12 / 448, not 0
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def fp8_supported(device: torch.device | str | None = None) -> bool:
    """True on CUDA devices with FP8 tensor cores (compute capability 8.9: Ada, Hopper, later)."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """float32 ``max(amax, AMAX_FLOOR) / 448``: the scale that maps ``amax`` onto 448."""
    return amax.float().clamp(min=AMAX_FLOOR) / FP8_MAX


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``e4m3(clamp(x / scale, ±448))``; ``scale`` broadcasts against ``x`` (float32 maths)."""
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``q · scale`` (float32 product), in ``dtype``."""
    return (q.float() * scale.float()).to(dtype)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``[N, K]`` 16/32-bit weight → (E4M3 ``[N, K]``, float32 scale per output channel ``[N]``)."""
    _check_float_matrix("weight", weight)
    scale = scale_from_amax(weight.abs().amax(dim=1))
    return quantize(weight, scale[:, None]), scale


def quantize_per_token(
    x: torch.Tensor, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations ``[M, K]`` → (E4M3 ``[M, K]``, float32 scale). Dynamic (``scale=None``): one
    scale per row from its own amax, ``[M]``; static: the given per-tensor scale (one element),
    returned as it is."""
    _check_float_matrix("x", x)
    if scale is None:
        amax = x.abs().amax(dim=1) if x.shape[1] else x.new_zeros(x.shape[0])
        scale = scale_from_amax(amax)
        return quantize(x, scale[:, None]), scale
    _check_scale("scale", scale, 1)
    return quantize(x, scale.reshape(1, 1)), scale


def _check_float_matrix(name: str, x: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype not in _FLOATS:
        raise ValueError(f"{name} must be a 2-D float32/float16/bfloat16 tensor, got "
                         f"{tuple(x.shape)} {x.dtype}")  # fmt: skip


def _check_scale(name: str, scale: torch.Tensor, *sizes: int) -> None:
    """A float32 scale tensor with one of ``sizes`` elements (1: per tensor)."""
    if scale.dtype != torch.float32 or scale.numel() not in sizes:
        want = " or ".join(str(s) for s in dict.fromkeys(sizes))
        raise ValueError(f"{name} must be float32 with {want} element(s), got "
                         f"{tuple(scale.shape)} {scale.dtype}")  # fmt: skip


# --- references of the Triton launchers ------------------------------------------------------


def quantize_fp8(
    *,
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of `pagoda.kernels.fp8_quant.quantize_fp8` (:func:`quantize_per_token`)."""
    q, s = quantize_per_token(x, scale)
    if out is not None:
        out.copy_(q)
        q = out
    if out_scale is not None and scale is None:
        out_scale.copy_(s)
        s = out_scale
    return q, s


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
    """Reference of `pagoda.kernels.fp8_matmul.fp8_linear`: dequantize both operands, multiply
    in float32, add the bias, round once to the output dtype.

    ``x`` is E4M3 with ``x_scale`` (``[M]`` or one element), or 16/32-bit: quantized per token
    (``x_scale=None``), with a static per-tensor ``x_scale``, or not at all (``weight_only``)."""
    del config  # launch parameters only
    w = dequantize(weight, weight_scale.reshape(-1, 1))
    if x.dtype == FP8_DTYPE:
        a = dequantize(x, x_scale.reshape(-1, 1))
    elif weight_only:
        a = x.float()
    else:
        q, s = quantize_per_token(x, x_scale)
        a = dequantize(q, s.reshape(-1, 1))
    y = a @ w.T
    if bias is not None:
        y = y + bias.float()
    y = y.to(out_dtype or (torch.bfloat16 if x.dtype == FP8_DTYPE else x.dtype))
    if out is None:
        return y
    out.copy_(y)
    return out


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
    """Reference of `pagoda.kernels.write_kv_cache` with an E4M3 cache: each row stored as
    ``e4m3(row / scale)``, the scale per tensor (one element) or per KV head (``[Hkv]``)."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        rows = x[keep]
        if cache.dtype == FP8_DTYPE:
            _check_scale("KV scale", scale, 1, num_kv_heads)
            rows = quantize(rows, scale.reshape(1, -1, 1))
        cache[blocks, offsets] = rows.to(cache.dtype)


def dequantize_kv_cache(
    cache: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """An E4M3 cache ``[num_blocks, block_size, Hkv, D]`` as ``dtype`` values (whole pool)."""
    return dequantize(cache, scale.reshape(1, 1, -1, 1), dtype)


def paged_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    **kwargs,
) -> torch.Tensor:
    """Attention over an E4M3 paged cache: `pagoda.kernels.reference.paged_attention` on the
    dequantized pool (float32, whole pool: test-sized caches). The attention kernels get the
    same result without dequantizing: keys enter ``q·k`` as exact 16-bit values with the K
    scale folded into the softmax scale, and the V scale multiplies the output once."""
    from pagoda.kernels import reference

    return reference.paged_attention(
        q=q,
        k_cache=dequantize_kv_cache(k_cache, k_scale, torch.float32),
        v_cache=dequantize_kv_cache(v_cache, v_scale, torch.float32),
        **kwargs,
    )
