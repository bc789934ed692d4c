"""Split-KV ("flash-decoding") attention for the decode sequences of a batch.

A decode step has one query token per sequence, so one program per (sequence, KV head) leaves
most of a large GPU idle when the batch is small and the context long. Stage 1 cuts each
sequence's context into ``NUM_SPLITS`` tile-aligned segments and writes a normalised partial
output plus its log-sum-exp per segment; stage 2 merges the segments. The number of splits is a
host-side choice (batch size, KV heads, longest context), so it stays fixed inside a CUDA graph;
each program derives its segment from the true ``seq_lens`` on the device.

Decodes come first in the flattened batch with exactly one token each, so token ``i`` belongs to
sequence ``i`` for ``i < num_decodes``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import cdiv, next_pow2, prev_pow2
from pagoda.kernels.attn_common import (
    add_alibi,
    add_sink,
    alibi_arg,
    alibi_slopes,
    chunk_arg,
    first_key,
    kv_scale_args,
    kv_scales,
    load_kv_tile,
    online_softmax_step,
    paged_meta,
    paged_strides,
    score_scale,
    scores,
    sinks_arg,
    softcap_arg,
    widen_kv,
    window_arg,
)


@triton.jit(do_not_specialize=["window", "chunk"])
def _decode_stage1_kernel(
    out_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM], written directly when NUM_SPLITS == 1
    mid_o_ptr,  # [num_decodes, NUM_HEADS, NUM_SPLITS, HEAD_DIM_PADDED] float32 partial outputs
    mid_lse_ptr,  # [num_decodes, NUM_HEADS, NUM_SPLITS] float32 log2-sum-exp2 per segment
    q_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    scale,  # float32: softmax scale * log2(e) (with SOFTCAP: the softmax scale, see `scores`)
    window,  # keys the query sees, its own included (`attn_common.NO_WINDOW`: all of them)
    chunk,  # chunked attention's chunk (`attn_common.NO_CHUNK`: none; `first_key`)
    k_scale_ptr,  # [1] or [num_kv_heads] float32 (stride_kv_scale 0 or 1), read when KV_FP8
    v_scale_ptr,  # [1] or [num_kv_heads] float32
    stride_kv_scale,
    sinks_ptr,  # [NUM_HEADS] float32 attention sinks, read when HAS_SINKS (one split only)
    alibi_ptr,  # [NUM_HEADS] float32 ALiBi slopes, read when HAS_ALIBI
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_k_blk,
    stride_k_tok,
    stride_k_head,
    stride_v_blk,
    stride_v_tok,
    stride_v_head,
    stride_bt_seq,
    NUM_HEADS: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    KV_FP8: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    CHUNKED: tl.constexpr,  # chunked attention: `chunk` is read (`attn_common.first_key`)
    HAS_ALIBI: tl.constexpr,  # ALiBi: slope * (key - query) on each score (`add_alibi`)
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    # The query at seq_len - 1 sees the keys [kv_first, seq_len): its window or its chunk's,
    # or all of them.
    kv_first = first_key(seq_len - 1, window, chunk, CHUNKED)
    # Tile-aligned segment length, from the true length of this sequence's visible keys.
    split_len = tl.cdiv(tl.cdiv(seq_len - kv_first, NUM_SPLITS), TILE_SIZE) * TILE_SIZE
    kv_lo = kv_first + split * split_len
    kv_hi = tl.minimum(kv_lo + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    offs_t = tl.arange(0, TILE_SIZE)
    head = kv_head * QUERIES_PER_KV + offs_h  # [BLOCK_H] query heads of this KV head
    head_mask = offs_h < QUERIES_PER_KV
    dim_mask = offs_d < HEAD_DIM

    q = tl.load(
        q_ptr + seq * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=head_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )  # [BLOCK_H, HEAD_DIM_PADDED]

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM_PADDED], dtype=tl.float32)
    # An E4M3 cache: the K scale joins the softmax scale, the V scale multiplies each segment's
    # normalised output (the log-sum-exp, from the scores, already has the K scale).
    k_s, v_s = kv_scales(k_scale_ptr, v_scale_ptr, kv_head, stride_kv_scale, KV_FP8)
    if KV_FP8:
        scale = scale * k_s

    bt_row = block_tables_ptr + seq * stride_bt_seq
    slope = alibi_slopes(alibi_ptr, head, head_mask, HAS_ALIBI)  # [BLOCK_H] (log2 units)
    q_at = tl.zeros([BLOCK_H], dtype=tl.int32) + (seq_len - 1)  # the query's position
    # The single query sits at position seq_len - 1, so every key from kv_first on is visible.
    for kv_start in range(kv_lo, kv_hi, TILE_SIZE):
        kv_pos = kv_start + offs_t  # [TILE_SIZE]
        kv_mask = kv_pos < kv_hi
        k, v = load_kv_tile(
            k_cache_ptr,
            v_cache_ptr,
            bt_row,
            kv_pos,
            kv_mask,
            kv_head,
            offs_d,
            dim_mask,
            stride_k_blk,
            stride_k_tok,
            stride_k_head,
            stride_v_blk,
            stride_v_tok,
            stride_v_head,
            BLOCK_SIZE,
        )
        k, v = widen_kv(k, v, q.dtype, KV_FP8)
        s = scores(q, k, scale, SOFTCAP, DOT_PRECISION)  # [BLOCK_H, TILE_SIZE]
        s = add_alibi(s, slope, kv_pos, q_at, HAS_ALIBI)
        s = tl.where(kv_mask[None, :] & head_mask[:, None], s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, DOT_PRECISION)

    empty = l_i == 0.0
    if NUM_SPLITS == 1:  # with more, the sink joins in stage 2's merge
        acc, l_i = add_sink(acc, l_i, m_i, sinks_ptr, head, head_mask, HAS_SINKS)
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if KV_FP8:
        acc = acc * v_s
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + seq * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=head_mask[:, None] & dim_mask[None, :],
        )
    else:
        row = (seq * NUM_HEADS + head) * NUM_SPLITS + split  # [BLOCK_H] (decode, head, split)
        tl.store(
            mid_o_ptr + row[:, None] * HEAD_DIM_PADDED + offs_d[None, :],
            acc,
            mask=head_mask[:, None],
        )
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(mid_lse_ptr + row, lse, mask=head_mask)


@triton.jit
def _decode_stage2_kernel(
    out_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM]
    mid_o_ptr,  # [num_decodes, NUM_HEADS, NUM_SPLITS, HEAD_DIM_PADDED] float32
    mid_lse_ptr,  # [num_decodes, NUM_HEADS, NUM_SPLITS] float32
    sinks_ptr,  # [NUM_HEADS] float32, read when HAS_SINKS
    stride_o_tok,
    stride_o_head,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """Merge the segments of one (decode, head): weights are exp2(lse_s - max lse); an
    attention sink adds exp2(sink - max) to the total (the max taken over it too)."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    row = (seq * NUM_HEADS + head) * NUM_SPLITS + offs_s  # [NUM_SPLITS]
    lse = tl.load(mid_lse_ptr + row)  # [NUM_SPLITS]
    lse_max = tl.max(lse, axis=0)
    sink = float("-inf")
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head) * 1.4426950408889634  # log2 units, as the lse
        lse_max = tl.maximum(lse_max, sink)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.exp2(lse - lse_max)  # [NUM_SPLITS]; empty segments weigh 0
    part = tl.load(mid_o_ptr + row[:, None] * HEAD_DIM_PADDED + offs_d[None, :])  # [S, D_PAD]
    total = tl.sum(w, axis=0)
    if HAS_SINKS:
        total += tl.exp2(sink - lse_max)
    acc = tl.sum(part * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + seq * stride_o_tok + head * stride_o_head + offs_d,
        acc.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


def choose_num_splits(
    *, num_decodes: int, num_kv_heads: int, max_seq_len: int, num_sms: int, config: dict
) -> int:
    """How many KV segments per decode sequence; 1 means "no split-KV".

    Rule: split until the grid covers ``waves`` × SMs with (decode, KV head, split) programs,
    but keep every segment at least ``min_tokens_per_split`` long and at most ``max_splits``
    segments. A tuned config may fix ``num_splits`` instead. Powers of two only, which bounds
    the number of compiled variants.
    """
    if num_decodes <= 0:
        return 1
    by_length = max_seq_len // int(config["min_tokens_per_split"])
    if "num_splits" in config:
        wanted = int(config["num_splits"])
    else:
        programs = num_decodes * num_kv_heads
        wanted = cdiv(int(float(config["waves"]) * num_sms), programs)
    splits = min(wanted, by_length, int(config["max_splits"]))
    return prev_pow2(splits) if splits > 1 else 1


def launch_decode_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    num_decodes: int,
    num_splits: int,
    config: dict,
    sliding_window: int | None = None,
    softcap: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    attention_chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> None:
    """Attention for the first ``num_decodes`` sequences (one query token each), over their
    last ``sliding_window`` keys when given (only those tiles are read); ``k_scale``/``v_scale``:
    an E4M3 cache's scales (`attn_common.kv_scale_args`); ``sinks``: attention sinks
    (`attn_common.add_sink`; with splits, added in stage 2's merge); ``attention_chunk`` C:
    the query at p reads the keys p - p % C .. p only; ``alibi_slopes``: ALiBi
    (`attn_common.add_alibi`).

    Grid: stage 1 ``(num_decodes, num_kv_heads, num_splits)``; stage 2 ``(num_decodes, heads)``,
    skipped when ``num_splits == 1`` (stage 1 then writes ``out`` itself).
    """
    if num_decodes <= 0:
        return
    _, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    queries_per_kv = num_heads // num_kv_heads
    head_dim_padded = max(next_pow2(head_dim), 16)
    mid_o, mid_lse = _split_partials(out, num_decodes, num_heads, num_splits, head_dim_padded)
    sinks, has_sinks = sinks_arg(sinks, num_heads, seq_lens)
    alibi, has_alibi = alibi_arg(alibi_slopes, num_heads, seq_lens)
    _decode_stage1_kernel[(num_decodes, num_kv_heads, num_splits)](
        out,
        mid_o,
        mid_lse,
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        score_scale(scale, softcap),
        window_arg(sliding_window),
        chunk_arg(attention_chunk),
        *kv_scale_args(k_cache, k_scale, v_scale, seq_lens),
        sinks,
        alibi,
        *paged_strides(q, out, k_cache, v_cache, block_tables),
        NUM_HEADS=num_heads,
        HAS_SINKS=has_sinks,
        CHUNKED=attention_chunk is not None,
        HAS_ALIBI=has_alibi,
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_H=max(16, next_pow2(queries_per_kv)),
        NUM_SPLITS=num_splits,
        SOFTCAP=softcap_arg(softcap),
        **paged_meta(q, k_cache, config),
    )
    if num_splits > 1:
        _merge_splits(out, mid_o, mid_lse, sinks, has_sinks, head_dim)


def _split_partials(
    out: torch.Tensor, num_decodes: int, num_heads: int, num_splits: int, head_dim_padded: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1's per-split results, float32: each split's output ``[decodes, heads, splits,
    head_dim_padded]`` and log-sum-exp ``[decodes, heads, splits]``. With one split stage 1
    writes ``out`` itself and reads neither: ``out`` stands in (any pointer will do)."""
    if num_splits == 1:
        return out, out
    mid_o = torch.empty(
        (num_decodes, num_heads, num_splits, head_dim_padded),
        dtype=torch.float32,
        device=out.device,
    )
    mid_lse = torch.empty(
        (num_decodes, num_heads, num_splits), dtype=torch.float32, device=out.device
    )
    return mid_o, mid_lse


def _merge_splits(
    out: torch.Tensor,
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    sinks: torch.Tensor,
    has_sinks: bool,
    head_dim: int,
) -> None:
    """Stage 2: each decode's and head's split outputs merged into ``out`` by their log-sum-exps
    (a head's sink joining the denominator here, `has_sinks`)."""
    num_decodes, num_heads, num_splits, head_dim_padded = mid_o.shape
    _decode_stage2_kernel[(num_decodes, num_heads)](
        out,
        mid_o,
        mid_lse,
        sinks,
        out.stride(0),
        out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=head_dim_padded,
        NUM_SPLITS=num_splits,
        HAS_SINKS=has_sinks,
        num_warps=4 if head_dim_padded >= 128 else 2,
    )
