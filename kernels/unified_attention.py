"""One kernel for a mixed, ragged batch: decodes and prefill chunks in the same launch.

Each program owns ``BLOCK_Q`` consecutive query tokens of one sequence times the
``QUERIES_PER_KV`` query heads that share one KV head (``BLOCK_M = BLOCK_Q * QUERIES_PER_KV``
rows, padded to a power of two), so every K/V tile fetched from the paged cache is reused by the
whole GQA group. Programs map to sequences by a binary search over ``query_start_loc``, which
keeps the grid a function of host ints only (tokens, sequences) and so capturable in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
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
    query_tile,
    score_scale,
    scores,
    sinks_arg,
    softcap_arg,
    widen_kv,
    window_arg,
)


@triton.jit
def _find_seq(
    query_start_loc_ptr,  # [num_seqs + 1] int32
    q_block_idx,
    first_seq,
    num_seqs,
    BLOCK_Q: tl.constexpr,
):
    """Last sequence whose first q-block index is <= ``q_block_idx``.

    Sequence ``s`` starts at q-block ``(start_tok(s) - start_tok(first)) // BLOCK_Q + (s - first)``:
    monotone in ``s`` and leaving room for ``cdiv(len(s), BLOCK_Q)`` blocks; the few spare
    programs in the gaps exit early.
    """
    base = tl.load(query_start_loc_ptr + first_seq)
    lo = first_seq
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = (tl.load(query_start_loc_ptr + mid) - base) // BLOCK_Q + (mid - first_seq)
        if start <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["first_seq", "num_seqs", "window", "chunk"])
def _unified_attention_kernel(
    out_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM]
    q_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32, context length including the new tokens
    query_start_loc_ptr,  # [num_seqs + 1] int32
    scale,  # float32: softmax scale * log2(e) (with SOFTCAP: the softmax scale, see `scores`)
    first_seq,  # sequences before this one are handled elsewhere (split-KV decode)
    num_seqs,
    window,  # keys a query sees, its own included (`attn_common.NO_WINDOW`: all of them)
    chunk,  # chunked attention's chunk (`attn_common.NO_CHUNK`: none; `first_key`)
    k_scale_ptr,  # [1] or [num_kv_heads] float32 (stride_kv_scale 0 or 1), read when KV_FP8
    v_scale_ptr,  # [1] or [num_kv_heads] float32
    stride_kv_scale,
    sinks_ptr,  # [NUM_HEADS] float32 attention sinks, read when HAS_SINKS
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
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    KV_FP8: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    CHUNKED: tl.constexpr,  # chunked attention: `chunk` is read (`attn_common.first_key`)
    HAS_ALIBI: tl.constexpr,  # ALiBi: slope * (key - query) on each score (`add_alibi`)
):
    q_block_idx = tl.program_id(0)
    kv_head = tl.program_id(1)

    seq = _find_seq(query_start_loc_ptr, q_block_idx, first_seq, num_seqs, BLOCK_Q)
    base = tl.load(query_start_loc_ptr + first_seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block_local = q_block_idx - ((q_start - base) // BLOCK_Q + (seq - first_seq))
    if q_block_local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # tokens already cached before this step's chunk

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    offs_t = tl.arange(0, TILE_SIZE)
    q_pos = q_block_local * BLOCK_Q + offs_m // QUERIES_PER_KV  # [BLOCK_M] index in the chunk
    head = kv_head * QUERIES_PER_KV + offs_m % QUERIES_PER_KV  # [BLOCK_M] query head
    row_mask = (offs_m // QUERIES_PER_KV < BLOCK_Q) & (q_pos < q_len)
    dim_mask = offs_d < HEAD_DIM
    tok = (q_start + q_pos).to(tl.int64)  # [BLOCK_M] flattened token index

    q = tl.load(
        q_ptr + tok[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=row_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )  # [BLOCK_M, HEAD_DIM_PADDED]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    # An E4M3 cache: the K scale joins the softmax scale, the V scale multiplies the output once.
    k_s, v_s = kv_scales(k_scale_ptr, v_scale_ptr, kv_head, stride_kv_scale, KV_FP8)
    if KV_FP8:
        scale = scale * k_s

    q_abs = context_len + q_pos  # [BLOCK_M] absolute position of each query token
    # The last query of this block sees keys [0, context_len + its index]; nothing beyond.
    kv_end = tl.minimum(seq_len, context_len + (q_block_local + 1) * BLOCK_Q)
    # With a sliding window (or chunked attention) no query of this block sees a key before
    # kv_need: start at the tile holding it and load nothing before it. Tiles stay at
    # multiples of TILE_SIZE from key 0, and keys a row cannot see leave its state exactly as
    # it was, so a row's bits do not depend on the block it is in.
    kv_need = first_key(context_len + q_block_local * BLOCK_Q, window, chunk, CHUNKED)
    q_chunk = q_abs - q_abs % chunk  # [BLOCK_M] each row's chunk start (used when CHUNKED)
    slope = alibi_slopes(alibi_ptr, head, row_mask, HAS_ALIBI)  # [BLOCK_M] (log2 units)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    for kv_start in range(kv_need // TILE_SIZE * TILE_SIZE, kv_end, TILE_SIZE):
        kv_pos = kv_start + offs_t  # [TILE_SIZE]
        kv_mask = (kv_pos < kv_end) & (kv_pos >= kv_need)
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
        s = scores(q, k, scale, SOFTCAP, DOT_PRECISION)  # [BLOCK_M, TILE_SIZE]
        s = add_alibi(s, slope, kv_pos, q_abs, HAS_ALIBI)
        visible = (kv_pos[None, :] <= q_abs[:, None]) & kv_mask[None, :] & row_mask[:, None]
        visible = visible & (kv_pos[None, :] > q_abs[:, None] - window)
        if CHUNKED:
            visible = visible & (kv_pos[None, :] >= q_chunk[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, DOT_PRECISION)

    acc, l_i = add_sink(acc, l_i, m_i, sinks_ptr, head, row_mask, HAS_SINKS)
    # Rows with an empty context (padding) get zeros rather than 0/0.
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if KV_FP8:
        acc = acc * v_s
    tl.store(
        out_ptr + tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & dim_mask[None, :],
    )


def launch_unified_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    first_seq: int,
    first_token: int,
    config: dict,
    sliding_window: int | None = None,
    softcap: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    attention_chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> None:
    """Attend for sequences ``first_seq..`` (tokens ``first_token..``), one launch; with
    ``sliding_window`` W a query sees its last W keys (itself included) and reads only their
    tiles; ``softcap`` caps the scores (`attn_common.scores`); ``k_scale``/``v_scale``: an E4M3
    cache's scales (`attn_common.kv_scale_args`); ``sinks``: attention sinks
    (`attn_common.add_sink`); ``attention_chunk`` C: a query at position p sees the keys
    p - p % C .. p only, and reads from its chunk's tile on; ``alibi_slopes``: ALiBi
    (`attn_common.add_alibi`).

    Grid: ``(num_tokens - first_token) // BLOCK_Q + (num_seqs - first_seq)`` q-blocks × KV heads,
    an upper bound computed from shapes alone.
    """
    num_tokens, num_heads, _ = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    queries_per_kv = num_heads // num_kv_heads
    block_m, block_q = query_tile(config, q.shape[2], q.dtype, queries_per_kv)
    grid = ((num_tokens - first_token) // block_q + (num_seqs - first_seq), num_kv_heads)
    if grid[0] <= 0:
        return
    sinks, has_sinks = sinks_arg(sinks, num_heads, seq_lens)
    alibi, has_alibi = alibi_arg(alibi_slopes, num_heads, seq_lens)
    _unified_attention_kernel[grid](
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        score_scale(scale, softcap),
        first_seq,
        num_seqs,
        window_arg(sliding_window),
        chunk_arg(attention_chunk),
        *kv_scale_args(k_cache, k_scale, v_scale, seq_lens),
        sinks,
        alibi,
        *paged_strides(q, out, k_cache, v_cache, block_tables),
        QUERIES_PER_KV=queries_per_kv,
        HAS_SINKS=has_sinks,
        CHUNKED=attention_chunk is not None,
        HAS_ALIBI=has_alibi,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        SOFTCAP=softcap_arg(softcap),
        **paged_meta(q, k_cache, config),
    )
