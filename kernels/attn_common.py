"""Triton helpers shared by the unified (prefill+decode) and the split-KV decode kernels.

Scores are kept in log2 units (the softmax scale is pre-multiplied by log2(e)) so the inner loop
uses ``exp2``, which maps to one hardware instruction.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import interpreter_enabled, next_pow2

LOG2E = 1.0 / math.log(2.0)
NO_WINDOW = (
    1 << 30
)  # the `window` argument of layers without a sliding window: longer than any context


def window_arg(sliding_window: int | None) -> int:
    """The kernels' ``window`` argument: the keys a query sees, its own included."""
    if sliding_window is None:
        return NO_WINDOW
    if not 0 < sliding_window <= NO_WINDOW:
        raise ValueError(f"sliding_window must be in [1, {NO_WINDOW}], got {sliding_window}")
    return int(sliding_window)


NO_CHUNK = 1 << 30  # the `chunk` argument of layers without chunked attention: one chunk


def chunk_arg(attention_chunk: int | None) -> int:
    """The kernels' ``chunk`` argument: a query at position p sees the keys from
    p - p % chunk on (Llama 4's chunked attention; `first_key`), read where the ``CHUNKED``
    constexpr (``attention_chunk is not None``) is set: other layers compile without it."""
    if attention_chunk is None:
        return NO_CHUNK
    if not 0 < attention_chunk <= NO_CHUNK:
        raise ValueError(f"attention_chunk must be in [1, {NO_CHUNK}], got {attention_chunk}")
    return int(attention_chunk)


def score_scale(scale: float, softcap: float | None) -> float:
    """The factor the kernels multiply q . k by: in log2 units, or, with a soft cap, the natural
    scale (the cap applies to natural scores; :func:`scores` converts after it)."""
    return scale * LOG2E if not softcap else scale


def softcap_arg(softcap: float | None) -> float:
    """The ``SOFTCAP`` constexpr: 0.0 for none."""
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive, got {softcap}")
    return float(softcap or 0.0)


def sinks_arg(sinks: torch.Tensor | None, num_heads: int, fallback: torch.Tensor):
    """``(sinks, HAS_SINKS)`` for the kernels: attention sinks (gpt-oss), one float32 logit
    per query head that joins its softmax's denominator (`add_sink`); without them ``fallback``
    stands in, never read."""
    if sinks is None:
        return fallback, False
    if sinks.dtype != torch.float32 or sinks.shape != (num_heads,) or not sinks.is_contiguous():
        raise ValueError(f"sinks must be contiguous float32 [num_heads={num_heads}], got "
                         f"{tuple(sinks.shape)} {sinks.dtype}")  # fmt: skip
    if sinks.device != fallback.device:
        raise ValueError(f"sinks are on {sinks.device}, the attention on {fallback.device}")
    return sinks, True


def alibi_arg(slopes: torch.Tensor | None, num_heads: int, fallback: torch.Tensor):
    """``(slopes, HAS_ALIBI)`` for the kernels: ALiBi (BLOOM, MPT), one float32 slope per
    query head, each score plus ``slope * (key_pos - query_pos)`` (`add_alibi`); without them
    ``fallback`` stands in, never read."""
    if slopes is None:
        return fallback, False
    if slopes.dtype != torch.float32 or slopes.shape != (num_heads,) or not slopes.is_contiguous():
        raise ValueError(f"alibi_slopes must be contiguous float32 [num_heads={num_heads}], got "
                         f"{tuple(slopes.shape)} {slopes.dtype}")  # fmt: skip
    if slopes.device != fallback.device:
        raise ValueError(f"alibi_slopes are on {slopes.device}, the attention on {fallback.device}")
    return slopes, True


def dot_precision(dtype: torch.dtype) -> str:
    """How :func:`mma` multiplies. fp32 caches get exact products ("ieee"; the default would be
    TF32). Half types take the backend's default (tensor cores). Triton 3.9's interpreter
    multiplies bfloat16 as raw uint16 bits, so there bf16 operands are widened first
    ("upcast"): exact, as every bf16 value is an fp32 value and products accumulate in fp32."""
    if dtype == torch.float32:
        return "ieee"
    if dtype == torch.bfloat16 and interpreter_enabled():
        return "upcast"
    return "default"


def paged_strides(
    q: torch.Tensor,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
) -> tuple[int, ...]:
    """The stride arguments both attention kernels take, in their order (``stride_q_tok`` ..
    ``stride_bt_seq``); the head dimension of every tensor is contiguous (checked by the caller)."""
    return (
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
    )


def kv_scale_args(
    k_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    fallback: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(k_scale, v_scale, stride)`` for the kernels' scale pointers: an E4M3 cache
    (``float8_e4m3fn``) needs float32 scales of one element (stride 0) or one per KV head
    (stride 1), the ones it was written with; a 16/32-bit cache takes none (``fallback``, never
    read, stands in)."""
    from pagoda.kernels.fp8 import FP8_DTYPE

    if k_cache.dtype != FP8_DTYPE:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale/v_scale are for float8_e4m3fn caches, not {k_cache.dtype}")
        return fallback, fallback, 0
    hkv = k_cache.shape[2]
    if k_scale is None or v_scale is None:
        raise ValueError("a float8_e4m3fn KV cache needs its k_scale and v_scale")
    sizes = {k_scale.numel(), v_scale.numel()}
    bad = any(s.dtype != torch.float32 or not s.is_contiguous() for s in (k_scale, v_scale))
    if bad or len(sizes) != 1 or sizes.isdisjoint({1, hkv}):
        raise ValueError(
            f"k_scale and v_scale must be contiguous float32 with 1 or Hkv={hkv} elements each, "
            f"got {tuple(k_scale.shape)} {k_scale.dtype}, {tuple(v_scale.shape)} {v_scale.dtype}"
        )
    return k_scale, v_scale, 0 if sizes == {1} else 1


def width_shrink(head_dim: int, dtype: torch.dtype) -> int:
    """How much wider than 128 16-bit values a row of ``head_dim`` in ``dtype`` is (at least 1).

    Launch configs are sized for such rows; the attention launchers divide a config's
    ``TILE_SIZE`` and ``BLOCK_M`` by this, so the K/V stages in shared memory and the query
    tile in registers keep their size for Gemma's 256-wide heads or float32 (a 64-key tile at
    head size 256 in float32 would need 287 kB of shared memory, past an H100's 227 kB). A
    function of the head size and dtype only: every launch of a batch shrinks alike."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return max(1, max(next_pow2(head_dim), 16) * itemsize // 256)


# One K tile: 128 keys of 128 16-bit values. The prefill kernel's pipelined K/V stages then take
# 168 kB of sm_90's 227 kB; 256 such keys take 305 kB (the decode and unified kernels: 143 kB).
MAX_KV_TILE_BYTES = 32 << 10


def tile_size(config: dict, head_dim: int, dtype: torch.dtype) -> int:
    """The keys per K/V tile: the config's ``TILE_SIZE`` as a power of two, divided by
    :func:`width_shrink`, at most ``MAX_KV_TILE_BYTES`` per K tile (a config file may hold
    256 or 512 keys, sound for narrow heads, that no GPU's shared memory holds at head size
    128), and at least 16 (``tl.dot``: N, K >= 16). A function of the config, head size and
    dtype only, so launches that share a config share their tiles."""
    row_bytes = max(next_pow2(head_dim), 16) * torch.empty((), dtype=dtype).element_size()
    tile = next_pow2(max(int(config["TILE_SIZE"]), 16)) // width_shrink(head_dim, dtype)
    return max(min(tile, MAX_KV_TILE_BYTES // row_bytes), 16)


def query_tile(config: dict, head_dim: int, dtype: torch.dtype, queries_per_kv: int):
    """(BLOCK_M, BLOCK_Q): a program's query tile of the unified and prefill kernels, BLOCK_Q
    tokens × a KV head's ``queries_per_kv`` query heads in BLOCK_M rows; the config's
    ``BLOCK_M`` divided by :func:`width_shrink`, as a power of two, at least 16 rows and one
    token. A function of the config, head size and dtype only (batch invariance)."""
    shrink = width_shrink(head_dim, dtype)
    block_m = next_pow2(max(int(config["BLOCK_M"]) // shrink, 16, queries_per_kv))
    return block_m, block_m // queries_per_kv


def paged_meta(q: torch.Tensor, k_cache: torch.Tensor, config: dict) -> dict:
    """Constexprs and launch options both attention kernels share, from shapes and the config."""
    head_dim = q.shape[2]
    return {
        "HEAD_DIM": head_dim,
        "HEAD_DIM_PADDED": max(next_pow2(head_dim), 16),
        "BLOCK_SIZE": k_cache.shape[1],
        "TILE_SIZE": tile_size(config, head_dim, q.dtype),
        "DOT_PRECISION": dot_precision(q.dtype),
        "KV_FP8": k_cache.dtype != q.dtype,  # E4M3: tiles widened to q's dtype, scales applied
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }


@triton.jit
def mma(a, b, DOT_PRECISION: tl.constexpr):
    """``tl.dot`` with an fp32 result, per :func:`dot_precision`."""
    if DOT_PRECISION == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DOT_PRECISION == "ieee":
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def first_key(pos, window, chunk, CHUNKED: tl.constexpr):
    """The first key the query at ``pos`` sees: its window's start (pos - window + 1), with
    ``CHUNKED`` the later of that and its chunk's (pos - pos % chunk), at least 0. Monotone in
    ``pos``, so a tile's first row bounds the keys any of its rows reads (and its last row the
    keys all of them read), as for a window alone. Negative ``pos`` (empty rows) give 0
    whatever ``%`` rounds to."""
    lo = tl.maximum(pos - window + 1, 0)
    if CHUNKED:
        lo = tl.maximum(lo, pos - pos % chunk)
    return lo


@triton.jit
def scores(q, k, scale, SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """q . k^T in log2 units (`score_scale`); with ``SOFTCAP`` c > 0, c * tanh(s / c) of the
    natural scores s first (Gemma's attention logit soft cap)."""
    s = mma(q, k, DOT_PRECISION) * scale
    if SOFTCAP > 0:
        x = s / SOFTCAP
        t = tl.exp2(-2.0 * 1.4426950408889634 * tl.abs(x))  # exp(-2|x|), no overflow
        th = (1.0 - t) / (1.0 + t)
        s = tl.where(x < 0, -th, th) * (SOFTCAP * 1.4426950408889634)
    return s


@triton.jit
def load_kv_tile(
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_table_row_ptr,  # [max_blocks_per_seq] int32, this sequence's row
    kv_pos,  # [TILE] absolute token positions in the sequence
    kv_mask,  # [TILE] positions that exist
    kv_head,  # scalar KV head index
    offs_d,  # [HEAD_DIM_PADDED]
    dim_mask,  # [HEAD_DIM_PADDED]
    stride_k_blk,
    stride_k_tok,
    stride_k_head,
    stride_v_blk,
    stride_v_tok,
    stride_v_head,
    BLOCK_SIZE: tl.constexpr,
):
    """Gather one tile of keys (transposed, [D, TILE]) and values ([TILE, D]) via the block table."""
    # Block ids are int32 in the table; widen before multiplying so large pools cannot overflow.
    blk = tl.load(block_table_row_ptr + kv_pos // BLOCK_SIZE, mask=kv_mask, other=0).to(tl.int64)
    in_blk = kv_pos % BLOCK_SIZE
    k_off = blk * stride_k_blk + in_blk * stride_k_tok + kv_head * stride_k_head  # [TILE] int64
    v_off = blk * stride_v_blk + in_blk * stride_v_tok + kv_head * stride_v_head  # [TILE] int64
    k = tl.load(
        k_cache_ptr + k_off[None, :] + offs_d[:, None],
        mask=dim_mask[:, None] & kv_mask[None, :],
        other=0.0,
    )  # [HEAD_DIM_PADDED, TILE]
    v = tl.load(
        v_cache_ptr + v_off[:, None] + offs_d[None, :],
        mask=kv_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )  # [TILE, HEAD_DIM_PADDED]
    return k, v


@triton.jit
def kv_scales(k_scale_ptr, v_scale_ptr, kv_head, stride_scale, KV_FP8: tl.constexpr):
    """This KV head's (K, V) scales of an E4M3 cache; (1, 1) for a 16/32-bit one (not read).

    One ``return`` after the constexpr branch: compiled Triton type-checks every ``return`` of
    a function, even one a constexpr ``if`` skips, and refuses returns of different types."""
    k_s = 1.0
    v_s = 1.0
    if KV_FP8:
        k_s = tl.load(k_scale_ptr + kv_head * stride_scale)
        v_s = tl.load(v_scale_ptr + kv_head * stride_scale)
    return k_s, v_s


@triton.jit
def widen_kv(k, v, dtype, KV_FP8: tl.constexpr):
    """E4M3 tiles as ``dtype`` (q's): exact, every E4M3 value is a float16/bfloat16/float32
    value, so ``q·k`` and ``p·v`` run on the 16-bit path with the scales applied outside.

    One ``return``, as in :func:`kv_scales`: an early ``return k.to(dtype)`` inside the
    constexpr ``if`` compiles under the interpreter but not for a GPU ("Return type mismatch":
    E4M3 against ``dtype``)."""
    if KV_FP8:
        k = k.to(dtype)
        v = v.to(dtype)
    return k, v


@triton.jit
def alibi_slopes(alibi_ptr, head, head_mask, HAS_ALIBI: tl.constexpr):
    """Each row's ALiBi slope in log2 units (the scores' `scores`), by query head; zeros
    without ``HAS_ALIBI`` (never read then)."""
    if HAS_ALIBI:
        return tl.load(alibi_ptr + head, mask=head_mask, other=0.0) * 1.4426950408889634
    return tl.zeros(head.shape, dtype=tl.float32)


@triton.jit
def add_alibi(s, slope, kv_pos, q_pos, HAS_ALIBI: tl.constexpr):
    """Scores ``s`` [rows, TILE_SIZE] (log2 units) plus each row's ``slope`` (`alibi_slopes`)
    times ``kv_pos - q_pos`` (ALiBi), before the mask; as given without ``HAS_ALIBI``."""
    if HAS_ALIBI:
        s = s + slope[:, None] * (kv_pos[None, :] - q_pos[:, None]).to(tl.float32)
    return s


@triton.jit
def add_sink(acc, l_i, m_i, sinks_ptr, head, head_mask, HAS_SINKS: tl.constexpr):
    """``(acc, l_i)`` after each row's attention sink (natural units, loaded by query head)
    joins its softmax denominator once, after its last tile: both rescaled to the larger of
    the running max ``m_i`` (log2 units) and the sink, ``l_i`` plus exp2(sink - that max); a
    row that saw no key keeps acc 0 (then its output is 0, as Hugging Face's). As given
    without ``HAS_SINKS``."""
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=head_mask, other=float("-inf")) * 1.4426950408889634
        m_fin = tl.maximum(m_i, sink)
        m_ref = tl.where(m_fin == float("-inf"), 0.0, m_fin)
        alpha = tl.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.exp2(sink - m_ref)
        acc = acc * alpha[:, None]
    return acc, l_i


@triton.jit
def online_softmax_step(
    s,  # [M, TILE] float32 scores in log2 units, -inf where masked
    v,  # [TILE, HEAD_DIM_PADDED]
    m_i,  # [M] running max
    l_i,  # [M] running sum of exp2
    acc,  # [M, HEAD_DIM_PADDED] float32 running numerator
    DOT_PRECISION: tl.constexpr,
):
    """One flash-attention update; rows with nothing visible yet stay at m=-inf, l=0, acc=0."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, DOT_PRECISION)
    return m_new, l_i, acc
