"""FlashAttention-2-style attention for the prefill rows of a batch over the paged KV cache.

A program owns one query tile of one sequence and one KV head: ``BLOCK_Q`` consecutive query
tokens times the ``QUERIES_PER_KV`` query heads that share the KV head (``BLOCK_M`` rows). Each
K/V tile it gathers through the block table is loaded once and serves every row of the tile,
so the GQA group shares it. The scores never leave registers: the softmax is online, in fp32
and base 2.

What makes it faster than the unified kernel on long prompts:

* large query tiles (``BLOCK_M`` up to 128 rows) and K/V tiles (``TILE_SIZE`` 64-128);
* the K/V loop runs in three parts: tiles every row of the query tile sees in full run without
  any mask (no predicated loads, no ``where``); only the tiles on the causal diagonal and, with
  a sliding window or chunked attention, at the window's or chunk's start compute masks;
* causal tile skipping: the loop stops at the last key the tile's last query sees; a sliding
  window starts at the first query's window, so a window layer reads only its window's blocks
  (a chunked layer, Llama 4's: its chunk's, from the first query's chunk start on);
* the heaviest query tiles (last in their sequence, longest causal range) start first, so the
  grid does not end on a tail of long programs;
* each loop is software-pipelined by Triton (``num_stages``).

Batch invariance. A row's bits depend on its own inputs and the launch config only: K/V tiles
start at key 0 (multiples of ``TILE_SIZE``) and are visited in order, and a tile a row cannot
see leaves its state exactly as it was, so where a row sits (which query tile, which batch,
decode or chunk) does not change its arithmetic. Every reduction over keys runs on the MMA
(``QK^T``, ``PV``, and the row sum of the probabilities as ``P @ ones``) or is exact (the
running max), never through a ``tl.sum`` whose order would follow the register layout of the
launch config. A decode row (``BLOCK_M`` 16) and a chunk row (``BLOCK_M`` 128) with the same
``TILE_SIZE`` therefore run the same sequence of operations; ``paged_attention`` keeps
``TILE_SIZE`` the same for both in batch-invariant mode.

KV dtype: tiles are read by :func:`_load_kv` and converted to the query's dtype there. An E4M3
cache (``float8_e4m3fn``) is widened exactly, its K scale joins the softmax scale and its V
scale multiplies the output, as in the other two kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pagoda.kernels._common import next_pow2
from pagoda.kernels.attn_common import (
    add_alibi,
    add_sink,
    alibi_arg,
    alibi_slopes,
    chunk_arg,
    dot_precision,
    first_key,
    kv_scale_args,
    kv_scales,
    mma,
    paged_strides,
    query_tile,
    score_scale,
    scores,
    sinks_arg,
    softcap_arg,
    tile_size,
    window_arg,
)
from pagoda.kernels.image_spans import image_span_rows, span_visible, spans_arg


@triton.jit
def _find_seq(query_start_loc_ptr, q_block_idx, first_seq, last_seq, BLOCK_Q: tl.constexpr):
    """Last sequence in ``[first_seq, last_seq)`` whose first query tile is <= ``q_block_idx``.

    Sequence ``s`` starts at tile ``(start_tok(s) - start_tok(first)) // BLOCK_Q + (s - first)``:
    monotone in ``s`` with room for its ``cdiv(len(s), BLOCK_Q)`` tiles; spare programs exit.
    """
    base = tl.load(query_start_loc_ptr + first_seq)
    lo = first_seq
    hi = last_seq
    while lo < hi:
        mid = (lo + hi) // 2
        start = (tl.load(query_start_loc_ptr + mid) - base) // BLOCK_Q + (mid - first_seq)
        if start <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _load_kv(
    k_cache_ptr,
    v_cache_ptr,
    bt_row,  # this sequence's block-table row
    kv_pos,  # [TILE] absolute key positions
    kv_mask,  # [TILE] keys to read (ignored unless MASKED)
    kv_head,
    offs_d,
    dim_mask,
    stride_k_blk,
    stride_k_tok,
    stride_k_head,
    stride_v_blk,
    stride_v_tok,
    stride_v_head,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    DIM_PADDED: tl.constexpr,
):
    """K transposed ([D, TILE]) and V ([TILE, D]) through the block table, in ``COMPUTE_DTYPE``."""
    # Block ids are int32 in the table; widen before multiplying so large pools cannot overflow.
    if MASKED:
        blk = tl.load(bt_row + kv_pos // BLOCK_SIZE, mask=kv_mask, other=0).to(tl.int64)
    else:
        blk = tl.load(bt_row + kv_pos // BLOCK_SIZE).to(tl.int64)
    in_blk = kv_pos % BLOCK_SIZE
    k_off = blk * stride_k_blk + in_blk * stride_k_tok + kv_head * stride_k_head
    v_off = blk * stride_v_blk + in_blk * stride_v_tok + kv_head * stride_v_head
    k_ptrs = k_cache_ptr + k_off[None, :] + offs_d[:, None]
    v_ptrs = v_cache_ptr + v_off[:, None] + offs_d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=dim_mask[:, None] & kv_mask[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask[:, None] & dim_mask[None, :], other=0.0)
    elif DIM_PADDED:
        k = tl.load(k_ptrs, mask=dim_mask[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=dim_mask[None, :], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    return k.to(COMPUTE_DTYPE), v.to(COMPUTE_DTYPE)


@triton.jit
def _attend_tiles(
    acc,  # [BLOCK_M, HEAD_DIM_PADDED] fp32 running numerator
    acc_l,  # [BLOCK_M, 16] fp32 running denominator (every column the same)
    m_i,  # [BLOCK_M] running max (log2 units)
    q,  # [BLOCK_M, HEAD_DIM_PADDED]
    ones,  # [TILE_SIZE, 16] ones (tl.dot: N >= 16) in the compute dtype
    kv_lo,  # first key of the first tile (a multiple of TILE_SIZE)
    kv_hi,  # end of the tiles' range
    kv_need,  # keys before this are never read (the tile's first window or chunk)
    kv_end,  # keys from here on are never read (past the last query)
    q_abs,  # [BLOCK_M] absolute position of each row's query
    q_chunk,  # [BLOCK_M] where each row's attention chunk starts (read when CHUNKED)
    window,
    slope,  # [BLOCK_M] each row's ALiBi slope, log2 units (read when HAS_ALIBI)
    span_lo,  # [BLOCK_M] first and last key of each row's image span (read when HAS_SPANS)
    span_hi,
    k_cache_ptr,
    v_cache_ptr,
    bt_row,
    kv_head,
    offs_d,
    dim_mask,
    scale,
    stride_k_blk,
    stride_k_tok,
    stride_k_head,
    stride_v_blk,
    stride_v_tok,
    stride_v_head,
    COMPUTE_DTYPE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    SOFTCAP: tl.constexpr,
    MASKED: tl.constexpr,
    DIM_PADDED: tl.constexpr,
    CHUNKED: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_SPANS: tl.constexpr,
):
    """Online softmax over the K/V tiles ``[kv_lo, kv_hi)``; ``MASKED`` tiles mask causality,
    the window or chunk and the range (with ``HAS_SPANS`` each row's image span seen too:
    `image_spans`), the others are seen in full by every row."""
    offs_t = tl.arange(0, TILE_SIZE)
    for kv_start in range(kv_lo, kv_hi, TILE_SIZE):
        kv_pos = kv_start + offs_t
        kv_mask = (kv_pos < kv_end) & (kv_pos >= kv_need)
        k, v = _load_kv(
            k_cache_ptr, v_cache_ptr, bt_row, kv_pos, kv_mask, kv_head, offs_d, dim_mask,
            stride_k_blk, stride_k_tok, stride_k_head, stride_v_blk, stride_v_tok, stride_v_head,
            COMPUTE_DTYPE, BLOCK_SIZE, MASKED, DIM_PADDED,
        )  # fmt: skip
        s = scores(q, k, scale, SOFTCAP, DOT_PRECISION)  # [BLOCK_M, TILE_SIZE]
        s = add_alibi(s, slope, kv_pos, q_abs, HAS_ALIBI)  # (every tile: a bias, not a mask)
        if MASKED:
            visible = (kv_pos[None, :] <= q_abs[:, None]) & kv_mask[None, :]
            visible = visible & (kv_pos[None, :] > q_abs[:, None] - window)
            if CHUNKED:
                visible = visible & (kv_pos[None, :] >= q_chunk[:, None])
            visible = span_visible(visible, kv_pos, kv_mask, span_lo, span_hi, HAS_SPANS)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_ref[:, None]).to(COMPUTE_DTYPE)
        alpha = tl.exp2(m_i - m_ref)
        # Numerator and denominator both accumulate on the MMA, from the same rounded p.
        acc = acc * alpha[:, None] + mma(p, v, DOT_PRECISION)
        acc_l = acc_l * alpha[:, None] + mma(p, ones, DOT_PRECISION)
        m_i = m_new
    return acc, acc_l, m_i


@triton.jit(do_not_specialize=["first_seq", "last_seq", "window", "chunk"])
def _prefill_attention_kernel(
    out_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM]
    q_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32, context length including the new tokens
    query_start_loc_ptr,  # [num_seqs + 1] int32
    scale,  # float32: softmax scale * log2(e) (with SOFTCAP: the softmax scale, see `scores`)
    first_seq,  # this launch covers sequences [first_seq, last_seq)
    last_seq,
    window,  # keys a query sees, its own included (`attn_common.NO_WINDOW`: all of them)
    chunk,  # chunked attention's chunk (`attn_common.NO_CHUNK`: none; `first_key`)
    k_scale_ptr,  # [1] or [num_kv_heads] float32 (stride_kv_scale 0 or 1), read when KV_FP8
    v_scale_ptr,  # [1] or [num_kv_heads] float32
    stride_kv_scale,
    sinks_ptr,  # [NUM_HEADS] float32 attention sinks, read when HAS_SINKS
    alibi_ptr,  # [NUM_HEADS] float32 ALiBi slopes, read when HAS_ALIBI
    spans_ptr,  # [num_tokens, 2] int32 each row's image span (`image_spans`), read when HAS_SPANS
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
    ONE_TOKEN_PER_SEQ: tl.constexpr,  # decodes: program i is sequence first_seq + i
    DIM_PADDED: tl.constexpr,  # HEAD_DIM < HEAD_DIM_PADDED: loads mask the padding
    KV_FP8: tl.constexpr,  # an E4M3 cache: tiles widened in `_load_kv`, scales applied here
    HAS_SINKS: tl.constexpr,  # attention sinks join each row's denominator (`add_sink`)
    CHUNKED: tl.constexpr,  # chunked attention: `chunk` is read (`attn_common.first_key`)
    HAS_ALIBI: tl.constexpr,  # ALiBi: slope * (key - query) on each score (`add_alibi`)
    HAS_SPANS: tl.constexpr,  # bidirectional image spans (`image_spans`: Gemma 3's images)
):
    kv_head = tl.program_id(1)
    if ONE_TOKEN_PER_SEQ:
        seq = first_seq + tl.program_id(0)
        q_block_local = 0
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    else:
        # The last tiles of the last sequences (the longest causal ranges) are scheduled first.
        q_block_idx = tl.num_programs(0) - 1 - tl.program_id(0)
        seq = _find_seq(query_start_loc_ptr, q_block_idx, first_seq, last_seq, BLOCK_Q)
        base = tl.load(query_start_loc_ptr + first_seq)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        q_block_local = q_block_idx - ((q_start - base) // BLOCK_Q + (seq - first_seq))
    if q_block_local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # tokens cached before this step's chunk

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    q_pos = q_block_local * BLOCK_Q + offs_m // QUERIES_PER_KV  # [BLOCK_M] index in the chunk
    head = kv_head * QUERIES_PER_KV + offs_m % QUERIES_PER_KV  # [BLOCK_M] query head
    row_mask = (offs_m // QUERIES_PER_KV < BLOCK_Q) & (q_pos < q_len)
    dim_mask = offs_d < HEAD_DIM
    tok = (q_start + q_pos).to(tl.int64)  # [BLOCK_M] flattened token index
    io_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(
        q_ptr + tok[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=io_mask,
        other=0.0,
    )  # [BLOCK_M, HEAD_DIM_PADDED]
    compute_dtype = q_ptr.dtype.element_ty

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)
    acc_l = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    ones = tl.full([TILE_SIZE, 16], 1.0, dtype=compute_dtype)
    # An E4M3 cache: the K scale joins the softmax scale, the V scale multiplies the output once.
    k_s, v_s = kv_scales(k_scale_ptr, v_scale_ptr, kv_head, stride_kv_scale, KV_FP8)
    if KV_FP8:
        scale = scale * k_s

    q_abs = context_len + q_pos  # [BLOCK_M] absolute position (padding rows: past the last)
    q_first = context_len + q_block_local * BLOCK_Q  # first query of the tile
    q_last = context_len + tl.minimum(q_block_local * BLOCK_Q + BLOCK_Q, q_len) - 1
    kv_end = q_last + 1  # no row of the tile sees a key from here on
    q_chunk = q_abs - q_abs % chunk  # [BLOCK_M] each row's chunk start (used when CHUNKED)
    kv_need = first_key(q_first, window, chunk, CHUNKED)  # no row sees a key before this
    # (image rows: their spans' keys too, from the earliest image start to the latest end)
    span_lo, span_hi, kv_need, kv_end = image_span_rows(
        spans_ptr, tok, row_mask, kv_need, kv_end, HAS_SPANS
    )
    kv_lo = kv_need // TILE_SIZE * TILE_SIZE
    # Tiles in [full_lo, full_hi) are seen whole by every row: past the last row's window (or
    # chunk) start and not past the first row's own position.
    full_lo = tl.maximum(
        tl.cdiv(first_key(q_last, window, chunk, CHUNKED), TILE_SIZE) * TILE_SIZE, kv_lo
    )
    full_hi = tl.maximum((q_first + 1) // TILE_SIZE * TILE_SIZE, full_lo)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    slope = alibi_slopes(alibi_ptr, head, row_mask, HAS_ALIBI)  # [BLOCK_M] (log2 units)
    acc, acc_l, m_i = _attend_tiles(
        acc, acc_l, m_i, q, ones, kv_lo, full_lo, kv_need, kv_end, q_abs, q_chunk, window, slope,
        span_lo, span_hi, k_cache_ptr, v_cache_ptr, bt_row, kv_head, offs_d, dim_mask, scale,
        stride_k_blk, stride_k_tok, stride_k_head, stride_v_blk, stride_v_tok, stride_v_head,
        compute_dtype, BLOCK_SIZE, TILE_SIZE, DOT_PRECISION, SOFTCAP, True, DIM_PADDED, CHUNKED,
        HAS_ALIBI, HAS_SPANS,
    )  # fmt: skip
    acc, acc_l, m_i = _attend_tiles(
        acc, acc_l, m_i, q, ones, full_lo, full_hi, kv_need, kv_end, q_abs, q_chunk, window, slope,
        span_lo, span_hi, k_cache_ptr, v_cache_ptr, bt_row, kv_head, offs_d, dim_mask, scale,
        stride_k_blk, stride_k_tok, stride_k_head, stride_v_blk, stride_v_tok, stride_v_head,
        compute_dtype, BLOCK_SIZE, TILE_SIZE, DOT_PRECISION, SOFTCAP, False, DIM_PADDED, CHUNKED,
        HAS_ALIBI, HAS_SPANS,
    )  # fmt: skip
    acc, acc_l, m_i = _attend_tiles(
        acc, acc_l, m_i, q, ones, full_hi, kv_end, kv_need, kv_end, q_abs, q_chunk, window, slope,
        span_lo, span_hi, k_cache_ptr, v_cache_ptr, bt_row, kv_head, offs_d, dim_mask, scale,
        stride_k_blk, stride_k_tok, stride_k_head, stride_v_blk, stride_v_tok, stride_v_head,
        compute_dtype, BLOCK_SIZE, TILE_SIZE, DOT_PRECISION, SOFTCAP, True, DIM_PADDED, CHUNKED,
        HAS_ALIBI, HAS_SPANS,
    )  # fmt: skip

    # Every column of acc_l holds the row's sum: the max picks it exactly, whatever the layout.
    l_i = tl.max(acc_l, axis=1)
    acc, l_i = add_sink(acc, l_i, m_i, sinks_ptr, head, row_mask, HAS_SINKS)
    # Rows with an empty context (CUDA-graph padding) get zeros rather than 0/0.
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if KV_FP8:
        acc = acc * v_s
    tl.store(
        out_ptr + tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


def check_kv_dtype(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """The cache formats the kernel reads: the query's dtype, or E4M3 (``float8_e4m3fn``) with
    its scales (`_load_kv` widens the tiles in one place)."""
    from pagoda.kernels.fp8 import FP8_DTYPE

    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, FP8_DTYPE):
        raise ValueError(
            f"prefill attention reads caches in the query's dtype or float8_e4m3fn; got q "
            f"{q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}"
        )


def launch_prefill_attention(
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
    last_seq: int,
    first_token: int,
    last_token: int,
    config: dict,
    one_token_per_seq: bool = False,
    sliding_window: int | None = None,
    softcap: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    attention_chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    image_spans: torch.Tensor | None = None,
) -> None:
    """Attend for sequences ``[first_seq, last_seq)``, whose query rows are the tokens
    ``[first_token, last_token)``, in one launch (module docstring). ``one_token_per_seq``: each
    of them has exactly one query token (decodes); the grid is then one program per sequence.
    ``k_scale``/``v_scale``: an E4M3 cache's scales (`attn_common.kv_scale_args`); ``sinks``:
    attention sinks (`attn_common.add_sink`); ``attention_chunk`` C: a query at position p
    sees the keys p - p % C .. p only (chunked attention), and its tiles start at its chunk's;
    ``alibi_slopes``: ALiBi (`attn_common.add_alibi`, on every tile, the full ones too);
    ``image_spans``: int32 ``[num_tokens, 2]``, each row's bidirectional image span
    (`image_spans`; None: causal rows only, the kernel compiled without them).

    Grid: ``(last_token - first_token) // BLOCK_Q + (last_seq - first_seq)`` query tiles × KV
    heads, an upper bound from host ints only (CUDA-graph capturable); spare programs exit.
    """
    check_kv_dtype(q, k_cache, v_cache)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    queries_per_kv = num_heads // num_kv_heads
    dim_padded = max(next_pow2(head_dim), 16)
    # Configs are sized for rows of up to 128 16-bit values; wider rows (Gemma's 256-wide heads,
    # float32 at 128) get tiles shrunk in proportion (`attn_common.width_shrink`), so the K/V
    # stages and the query tile keep their shared-memory and register size. A function of the
    # head size and dtype only: both launches of batch-invariant mode shrink alike.
    tile = tile_size(config, head_dim, q.dtype)
    block_m, block_q = query_tile(config, head_dim, q.dtype, queries_per_kv)
    num_seqs = last_seq - first_seq
    if one_token_per_seq:
        grid = (num_seqs, num_kv_heads)
    else:
        grid = ((last_token - first_token) // block_q + num_seqs, num_kv_heads)
    if num_seqs <= 0 or grid[0] <= 0:
        return
    sinks, has_sinks = sinks_arg(sinks, num_heads, seq_lens)
    alibi, has_alibi = alibi_arg(alibi_slopes, num_heads, seq_lens)
    spans, has_spans = spans_arg(image_spans, q.shape[0], seq_lens)
    _prefill_attention_kernel[grid](
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        score_scale(scale, softcap),
        first_seq,
        last_seq,
        window_arg(sliding_window),
        chunk_arg(attention_chunk),
        *kv_scale_args(k_cache, k_scale, v_scale, seq_lens),
        sinks,
        alibi,
        spans,
        *paged_strides(q, out, k_cache, v_cache, block_tables),
        QUERIES_PER_KV=queries_per_kv,
        HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=dim_padded,
        BLOCK_SIZE=k_cache.shape[1],
        TILE_SIZE=tile,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        DOT_PRECISION=dot_precision(q.dtype),
        SOFTCAP=softcap_arg(softcap),
        ONE_TOKEN_PER_SEQ=one_token_per_seq,
        DIM_PADDED=head_dim != dim_padded,
        KV_FP8=k_cache.dtype != q.dtype,
        HAS_SINKS=has_sinks,
        CHUNKED=attention_chunk is not None,
        HAS_ALIBI=has_alibi,
        HAS_SPANS=has_spans,
        num_warps=int(config["num_warps"]),
        num_stages=int(config["num_stages"]),
    )
