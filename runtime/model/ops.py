"""Elementwise building blocks of the Llama layer, in PyTorch.

The same signatures are served by Triton kernels in `pagoda.kernels` on CUDA; `select_ops`
returns whichever set the device and attention backend call for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def rms_norm(
    *, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """RMSNorm as Hugging Face computes it: normalise in float32, round, then scale by the weight.

    (ATen's fused kernel run directly on bf16 loses enough precision to change greedy outputs.)
    With `residual`, returns (norm(x + r), x + r), adding in place.
    """
    if residual is not None:
        residual.add_(x)
        x = residual
    out = F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight
    return out if residual is None else (out, residual)


def gemma_rms_norm(
    *, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """Gemma's RMSNorm: normalise in float32, scale by ``weight`` = 1 + w (float32), round once
    (Llama's rounds before scaling). `rms_norm`'s signature; for a float32 model both are one."""
    if residual is not None:
        residual.add_(x)
        x = residual
    out = (F.rms_norm(x.float(), weight.shape, None, eps) * weight).to(x.dtype)
    return out if residual is None else (out, residual)


def gather_cos_sin(
    positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Rows of the cache for this step's positions, once per forward rather than once per layer."""
    return cos_sin_cache.index_select(0, positions).to(dtype)


def rotary_embedding(
    *,
    positions: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    widen: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half rotary on q [T, H, D] and k [T, Hkv, D], in place; cache rows are cat(cos, sin).

    With `positions=None`, `cos_sin_cache` already holds one row per token (see `gather_cos_sin`).
    When q and k are adjacent views of one fused qkv projection (the model's case) they are
    rotated as one tensor: half the kernel launches. Every product, sum and difference is rounded
    to the input dtype as Hugging Face's `q * cos + rotate_half(q) * sin` rounds it, or with
    `widen` computed in float32 and rounded once (LFM3's: `rotary_float32`).
    Returns (q, k).
    """
    cs = cos_sin_cache if positions is None else gather_cos_sin(positions, cos_sin_cache, q.dtype)
    cos, sin = cs.unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2]
    qk = _joint_view(q, k)
    for x in (q, k) if qk is None else (qk,):
        _rotate(*x.chunk(2, dim=-1), cos, sin, widen)
    return q, k


def rotary_interleaved(
    *,
    positions: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    widen: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotary_embedding` with the pairs (2i, 2i + 1) rotated by frequency i, not (i, i + D/2):
    GLM's and Cohere's layout (transformers' `rotate_half` over x[..., 0::2], x[..., 1::2] with
    cos/sin repeat_interleave'd). In place on q and k, every token and head in one set of ops;
    the same signature (and cache rows) as `rotary_embedding`. Rounded per product as it (GLM's),
    or with `widen` computed in float32 and rounded once (Cohere's); cos and sin are in the
    model's dtype either way, as transformers hands them over."""
    cs = cos_sin_cache if positions is None else gather_cos_sin(positions, cos_sin_cache, q.dtype)
    cos, sin = cs.unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2]
    for x in (q, k):
        pairs = x.unflatten(-1, (-1, 2))  # a view: [T, H, D/2, 2]
        _rotate(pairs[..., 0], pairs[..., 1], cos, sin, widen)
    return q, k


def _rotate(x1: torch.Tensor, x2: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            widen: bool) -> None:  # fmt: skip
    """(x1, x2) <- (x1 cos - x2 sin, x2 cos + x1 sin) in place, each product, sum and
    difference rounded to x's dtype (Hugging Face's rounding), or with `widen` in float32,
    rounded once."""
    if widen and x1.dtype != torch.float32:
        _rotate_widened(x1, x2, cos, sin)
        return
    new1 = torch.mul(x1, cos)
    tmp = torch.mul(x2, sin)
    new1.sub_(tmp)  # x1 cos - x2 sin
    torch.mul(x1, sin, out=tmp)
    x2.mul_(cos).add_(tmp)  # x2 cos + x1 sin
    x1.copy_(new1)


def _rotate_widened(x1: torch.Tensor, x2: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """(x1, x2) <- (x1 cos - x2 sin, x2 cos + x1 sin) in float32, rounded once, in place."""
    a, b, c, s = x1.float(), x2.float(), cos.float(), sin.float()
    x1.copy_(a * c - b * s)
    x2.copy_(b * c + a * s)


def rotary_float32(
    rotate,
    *,
    positions: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotate` (`rotary_embedding` or `rotary_interleaved`) in float32 with float32 cos and sin
    (the cache's rows, gathered here by `positions`, or this step's float32 rows), rounded once,
    in place on q and k: as transformers' ERNIE 4.5 and LFM3 apply their float32 tables to q and
    k of the model's dtype."""
    rows = (
        cos_sin_cache
        if positions is None
        else gather_cos_sin(positions, cos_sin_cache, torch.float32)
    )
    return rotate(positions=None, q=q, k=k, cos_sin_cache=rows, widen=True)


def _joint_view(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """[T, H + Hkv, D] over q and k when k's heads follow q's in memory, row by row."""
    (t, h, d), hk = q.shape, k.shape[1]
    if q.dtype != k.dtype or q.stride() != k.stride() or q.stride()[1:] != (d, 1):
        return None
    if k.data_ptr() != q.data_ptr() + h * d * q.element_size():
        return None
    return q.as_strided((t, h + hk, d), q.stride())


def silu_and_mul(*, x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] → silu(x[:, :I]) * x[:, I:] (the gate half of `x` is overwritten)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.mul(F.silu(gate, inplace=True), up)


def gelu_tanh_and_mul(*, x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] → gelu_tanh(x[:, :I]) * x[:, I:] (GeGLU, as Gemma's MLP computes it)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.mul(F.gelu(gate, approximate="tanh"), up)


def gelu_and_mul(*, x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] → gelu(x[:, :I]) * x[:, I:], the exact GELU (Zamba2's MLP)."""
    gate, up = x.chunk(2, dim=-1)
    return torch.mul(F.gelu(gate), up)


def relu2_and_mul(*, x: torch.Tensor) -> torch.Tensor:
    """[T, 2I] → relu(x[:, :I])² * x[:, I:] (transformers' ReLUSquaredActivation gating up:
    BitNet's MLP), in the model's dtype."""
    gate, up = x.chunk(2, dim=-1)
    return torch.mul(F.relu(gate).square(), up)


@dataclass(frozen=True)
class Ops:
    rms_norm: Callable[..., Any]
    rotary_embedding: Callable[..., Any]
    silu_and_mul: Callable[..., Any]
    pregather_rotary: bool = False  # gather cos/sin rows once per step, pass positions=None


TORCH_OPS = Ops(rms_norm, rotary_embedding, silu_and_mul, pregather_rotary=True)


def select_ops(device: torch.device, backend_name: str) -> Ops:
    """Fused Triton kernels on CUDA with the Triton backend; on CPU the native versions of these
    ops (`cpu_ops`, bit-identical, one C call each) where they build; PyTorch otherwise."""
    if device.type == "cuda" and backend_name == "triton":
        from pagoda import kernels

        return Ops(kernels.rms_norm, kernels.rotary_embedding, kernels.silu_and_mul)
    if device.type == "cpu":
        from pagoda.runtime.cpu.ops import cpu_ops

        return cpu_ops(TORCH_OPS) or TORCH_OPS
    return TORCH_OPS


def _yarn_find_dim(num_rot: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rot * 2 * math.pi))) / (2 * math.log(base))


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "proportional")


def rope_kind(scaling: dict[str, Any] | None) -> str:
    """The `rope_type` of a `rope_scaling` (older configs say `type`); "default" without one."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def rotary_dim(head_dim: int, scaling: dict[str, Any] | None) -> int:
    """The dims of each head that rotate: int(head_dim * partial_rotary_factor), as transformers
    takes them (the first ones; the rest pass through); "proportional": all of them (its
    `partial_rotary_factor` zeroes the last angles instead: `rope_inv_freq`)."""
    if rope_kind(scaling) == "proportional":
        return head_dim
    partial = float((scaling or {}).get("partial_rotary_factor") or 1.0)
    dim = int(head_dim * partial)
    if not 0 < dim <= head_dim or dim % 2:
        raise ValueError(f"partial_rotary_factor {partial} leaves {dim} of head_dim {head_dim} "
                         "rotating; it must be a positive even number")  # fmt: skip
    return dim


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, long: bool = False
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (over the rotating dims, `rotary_dim`) and the attention scale
    factor for the configured `rope_scaling`.

    Supports default, linear, dynamic (within the model's `max_position_embeddings`, where it
    is the default rotary: the engine refuses a longer context, `check_rope_context`), llama3
    (from its parameters, or a GGUF's per-frequency divisors, `freq_factors`), yarn (with
    DeepSeek's `mscale`/`mscale_all_dim` and `truncate`), longrope (Phi-3's: its short
    factors, or with `long` its long ones; `longrope.py` says which a token takes) and
    proportional (the first angles over the whole head, the rest 0), following the Hugging Face
    definitions. Anything else is a ValueError, one line.
    """
    dim = rotary_dim(head_dim, scaling)
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if not scaling:
        return inv, 1.0
    kind = rope_kind(scaling)
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    if kind == "longrope":
        return _longrope(dim, theta, scaling, long)
    factor = float(scaling.get("factor") or 1.0)
    if kind in ("default", "dynamic"):
        return inv, 1.0
    if kind == "proportional":  # the first partial_rotary_factor of the angles over the whole
        # head, the rest 0 (cos 1, sin 0: those dims pass through), all / factor (LFM3's, Gemma 4's)
        angles = int(float(scaling.get("partial_rotary_factor") or 1.0) * dim // 2)
        return torch.cat([inv[:angles], torch.zeros(dim // 2 - angles)]) / factor, 1.0
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3" and "freq_factors" in scaling:  # a GGUF's rope_freqs: divisors as given
        return inv / torch.tensor(scaling["freq_factors"], dtype=torch.float32), 1.0
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        return torch.where(medium, smoothed, scaled), 1.0
    # yarn (transformers' _compute_yarn_parameters)
    old_ctx = int(scaling.get("original_max_position_embeddings") or 4096)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)
    low = _yarn_find_dim(beta_fast, dim, theta, old_ctx)
    high = _yarn_find_dim(beta_slow, dim, theta, old_ctx)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = (torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)
    extrapolation = 1 - ramp.clamp(0, 1)
    inv = (inv / factor) * (1 - extrapolation) + inv * extrapolation
    mscale = scaling.get("attention_factor")
    if mscale is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if m and m_all:
            mscale = _yarn_mscale(factor, float(m)) / _yarn_mscale(factor, float(m_all))
        else:
            mscale = _yarn_mscale(factor)
    return inv, float(mscale)


def _longrope(dim: int, theta: float, scaling: dict[str, Any], long: bool):
    """transformers' _compute_longrope_parameters: 1 / (factors * theta ** (2i / dim)), and the
    attention factor sqrt(1 + ln(factor) / ln(original context)) unless the config gives one
    (`factor`: max_position_embeddings / original_max_position_embeddings, filled in by the
    loader where the config leaves it out; PhiMoE's `short_mscale` / `long_mscale`, by table)."""
    key = "long_factor" if long else "short_factor"
    factors = scaling.get(key)
    if not isinstance(factors, list | tuple) or len(factors) != dim // 2:
        raise ValueError(f"rope_scaling longrope needs {key}: {dim // 2} numbers (half the "
                         f"{dim} rotating dims), got {factors!r}")  # fmt: skip
    original = scaling.get("original_max_position_embeddings")
    if not original:
        raise ValueError("rope_scaling longrope needs original_max_position_embeddings")
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv = 1.0 / (torch.tensor(factors, dtype=torch.float32) * theta**shape)
    attention = scaling.get("attention_factor")
    mscale = scaling.get("long_mscale" if long else "short_mscale")  # PhiMoE's, by table
    if mscale is not None:
        attention = mscale
    if attention is None:
        factor = float(scaling.get("factor") or 1.0)
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv, float(attention)


def check_rope_context(scaling: dict[str, Any] | None, context: int, positions: int) -> None:
    """Dynamic NTK scaling changes the rotary base with the sequence's length once it passes the
    model's context (`max_position_embeddings`): cached keys rotated at one length would be
    wrong at the next, so a longer context is refused rather than served inexactly."""
    if rope_kind(scaling) == "dynamic" and positions > context:
        raise ValueError(
            f"rope_scaling 'dynamic' is exact only within the model's context ({context} "
            f"tokens); max_model_len {positions} exceeds it"
        )


def build_cos_sin_cache(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int
) -> torch.Tensor:
    """[max_positions, rotary_dim] float32 rows of cat(cos, sin) (vLLM's layout); for longrope
    [2 * max_positions, rotary_dim]: the short factors' rows, then the long ones'
    (`longrope.table_rows` picks a token's)."""
    tables = [False, True] if rope_kind(scaling) == "longrope" else [False]
    out = []
    for long in tables:
        inv, mscale = rope_inv_freq(head_dim, theta, scaling, long=long)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
        out.append(torch.cat([freqs.cos() * mscale, freqs.sin() * mscale], dim=-1))
    return torch.cat(out) if len(out) > 1 else out[0]
