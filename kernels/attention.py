"""``paged_attention``: the launcher the runtime calls, choosing between the two kernels.

* Mixed batches (decodes and prefill chunks) run in one launch of the unified kernel.
* Decodes switch to the split-KV kernel when ``choose_num_splits`` (batch size × KV heads vs.
  SMs, and the longest context) asks for more than one segment; any prefill sequences of the same
  batch then run in a second, unified launch that starts after the decodes.
* A decode-only batch that needs no split uses the split-KV kernel with one segment: it has no
  sequence search and no causal mask, so it is the leaner of the two for one query token.
* ``sliding_window``: each query sees its last W keys (its own included), and both kernels start
  at the window's first tile, so a window layer reads only the window's blocks; the split count
  of the decodes is chosen for the window's length. ``softcap`` caps the scores (Gemma).
* ``attention_chunk``: chunked attention (Llama 4's rotary layers), the query at position p
  sees the keys p - p % C .. p; a lower bound per row as a window's, so the kernels start at
  the first row's chunk and read only its blocks, and the decodes' split count is chosen for
  at most one chunk.
* ``sinks``: attention sinks (gpt-oss), one float32 logit per query head that joins its
  softmax's denominator only, added after a row's last tile (`attn_common.add_sink`; the
  split-KV decodes add it in their merge).
* Prefill rows (sequences after the decodes) run in the FlashAttention-2-style prefill kernel
  (``prefill_attention.py``; ``flash_prefill=False`` keeps them in the unified kernel). The
  decodes then always take the split-KV kernel (one segment when the rule asks for no split).
* ``image_spans`` (Gemma 3's images, int32 ``[T, 2]``): a query row inside an image also sees
  the keys up to its image's last position (`image_spans`); only the prefill kernel takes them
  (its ``HAS_SPANS`` variant): an image is whole in its prefill chunk, so a decode row's span
  is at most itself, and the decodes' kernels never read them.
* ``batch_invariant``: every row goes through the prefill kernel, the decodes in a launch with
  the ``max_query_len`` 1 config and the other sequences in one with the
  ``INVARIANT_PREFILL_LEN`` config, both with the decode config's ``TILE_SIZE``. Its K/V tiles
  start at key 0, a row's masked tiles leave it exactly as it was, and its reductions over keys
  run on the MMA, so a row gets the same bits as a decode, in a chunk on cached context, in a
  fresh prompt or beside any other sequences; no split-KV, whose merge order depends on the
  batch. With ``flash_prefill=False`` every row goes through the unified kernel with one config.

Everything is decided from shapes and host ints, so the launcher can be captured in CUDA graphs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from pagoda.kernels._common import check_device, next_pow2
from pagoda.kernels.attn_common import kv_scale_args
from pagoda.kernels.config import get_kernel_config, num_sms
from pagoda.kernels.decode_attention import choose_num_splits, launch_decode_attention
from pagoda.kernels.fp8 import FP8_DTYPE
from pagoda.kernels.prefill_attention import launch_prefill_attention
from pagoda.kernels.unified_attention import launch_unified_attention

# The unified kernel's bucket for every row in batch-invariant mode (``flash_prefill=False``).
INVARIANT_QUERY_LEN = 1
# The prefill kernel's buckets in batch-invariant mode: ``max_query_len`` 1 for the decodes, and
# this chunk-sized one for every other sequence.
INVARIANT_PREFILL_LEN = 2048
FLASH = "prefill_attention"  # the prefill kernel's name in the config files


def _validate(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected q [T, H, D] and caches [blocks, block_size, Hkv, D]; got {tuple(q.shape)}, "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} does not fit cache {tuple(k_cache.shape)}")
    if out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out must match q: {tuple(out.shape)}/{out.dtype} vs {tuple(q.shape)}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, FP8_DTYPE):
        raise ValueError(f"q/k_cache/v_cache dtypes differ: the caches must be q's dtype "
                         f"({q.dtype}) or float8_e4m3fn, got {k_cache.dtype}, {v_cache.dtype}")  # fmt: skip
    if q.stride(2) != 1 or out.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the head dimension of q, out and the caches must be contiguous")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {t.dtype}")
    if query_start_loc.dtype != torch.int32 or query_start_loc.shape[0] != seq_lens.shape[0] + 1:
        raise ValueError("query_start_loc must be int32 [num_seqs + 1]")
    if block_tables.shape[0] != seq_lens.shape[0] or block_tables.stride(1) != 1:
        raise ValueError("block_tables must be [num_seqs, max_blocks] with contiguous rows")


# The query tile a program holds (a KV head's query heads, at least): 16 heads of DeepSeek's
# latent 576 (1024 lanes) in bf16, 99 kB of shared memory on sm_90; its 128 heads in one tile
# needed 393 kB, past the 227 kB there (tests/kernels/sm90_compile.py's latent-d576-h128 case).
QUERY_TILE_BYTES = 16 * 1024 * 2


def max_query_heads(q: torch.Tensor) -> int:
    """The most query heads of one KV head a launch takes (`QUERY_TILE_BYTES`): more are
    attended in groups of this many, a function of the head size and dtype only (a row's result
    is the same whatever the batch: batch invariance holds)."""
    return max(1, QUERY_TILE_BYTES // (max(next_pow2(q.shape[2]), 16) * q.element_size()))


def _kv_head(scale: torch.Tensor | None, kv: slice) -> torch.Tensor | None:
    """A KV head's slice of an FP8 cache's scale (one element, or one per KV head)."""
    return scale if scale is None or scale.numel() == 1 else scale.reshape(-1)[kv]


def paged_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    num_decodes: int | None = None,
    num_kv_splits: int | None = None,
    batch_invariant: bool = False,
    sliding_window: int | None = None,
    softcap: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    flash_prefill: bool = True,
    sinks: torch.Tensor | None = None,
    attention_chunk: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    image_spans: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a ragged batch against a paged KV cache (module docstring).

    Shapes: ``q``/``out`` ``[T, H, D]`` (head dim contiguous); caches
    ``[num_blocks, block_size, Hkv, D]``; ``block_tables`` int32 ``[B, max_blocks]``;
    ``seq_lens`` int32 ``[B]`` (context including the new tokens); ``query_start_loc`` int32
    ``[B + 1]``. The first ``num_decodes`` sequences have one query token each (``None``: all of
    them when ``max_query_len == 1``, else none). ``max_seq_len`` only chooses the split count,
    so an upper bound is fine (e.g. under CUDA graphs). ``num_kv_splits`` (a power of two)
    overrides the rule, for tests and benchmarks. ``batch_invariant`` ignores both and runs
    every row the same way (module docstring). An E4M3 cache (``float8_e4m3fn``, written by
    `write_kv_cache` with ``k_scale``/``v_scale``) is read with the same scales: float32, one
    element or one per KV head; its tiles are widened to q's dtype (exact), the K scale joins
    the softmax scale and the V scale multiplies the output. ``flash_prefill=False`` runs the
    prefill rows in the unified kernel instead of the prefill kernel (comparisons). ``sinks``:
    float32 ``[H]`` attention sinks; ``attention_chunk``: chunked attention's chunk (module
    docstring); ``alibi_slopes``: float32 ``[H]``, each score plus slope * (key - query)
    (ALiBi: BLOOM, MPT; the kernels' ``HAS_ALIBI`` path); ``image_spans``: int32 ``[T, 2]``,
    each row's bidirectional image span (module docstring; the prefill kernel's, so
    ``flash_prefill=False`` refuses them). Returns ``out``.
    """
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _validate(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out)
    if image_spans is not None and not flash_prefill:
        raise ValueError("image_spans run in the prefill kernel: flash_prefill=False takes none")
    scales = [t for t in (k_scale, v_scale, sinks, alibi_slopes, image_spans) if t is not None]
    check_device(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, *scales)
    kv_scale_args(k_cache, k_scale, v_scale, seq_lens)  # validated once, before any launch
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or q.shape[0] == 0:
        return out
    if num_decodes is None:
        num_decodes = num_seqs if max_query_len == 1 else 0
    if not 0 <= num_decodes <= num_seqs:
        raise ValueError(f"num_decodes={num_decodes} outside [0, {num_seqs}]")
    call = _Call(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, max_query_len,
        max_seq_len, scale, out, num_decodes, num_kv_splits, batch_invariant, sliding_window,
        softcap, k_scale, v_scale, sinks, attention_chunk, alibi_slopes, image_spans,
    )  # fmt: skip
    if q.shape[1] // k_cache.shape[2] > max_query_heads(q):
        _in_head_groups(call, flash_prefill)
    elif flash_prefill:
        _flash_launches(call)
    else:
        _unified_launches(call)
    return out


class _Call(NamedTuple):
    """A `paged_attention` call's arguments as its launches read them (``num_decodes``
    resolved, ``out`` given)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    scale: float
    out: torch.Tensor
    num_decodes: int
    num_kv_splits: int | None
    batch_invariant: bool
    sliding_window: int | None
    softcap: float | None
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    sinks: torch.Tensor | None
    attention_chunk: int | None
    alibi_slopes: torch.Tensor | None
    image_spans: torch.Tensor | None

    def kernel_args(self, *, query_start_loc: bool = True) -> dict:
        """The arguments every kernel launcher takes alike (the decode kernel no
        ``query_start_loc``: `query_start_loc` False); not ``image_spans``, the prefill
        launch's alone."""
        args = dict(
            q=self.q, k_cache=self.k_cache, v_cache=self.v_cache, block_tables=self.block_tables,
            seq_lens=self.seq_lens, scale=self.scale, out=self.out,
            sliding_window=self.sliding_window, softcap=self.softcap, k_scale=self.k_scale,
            v_scale=self.v_scale, sinks=self.sinks, attention_chunk=self.attention_chunk,
            alibi_slopes=self.alibi_slopes,
        )  # fmt: skip
        if query_start_loc:
            args["query_start_loc"] = self.query_start_loc
        return args


def _in_head_groups(c: _Call, flash_prefill: bool) -> None:
    """`paged_attention` a KV head's query heads at a time, at most `max_query_heads` in a
    launch (the kernels hold a KV head's query heads in one tile): q, out, the caches, their
    FP8 scales, the sinks and the ALiBi slopes cut to each launch's heads."""
    kv_heads, group = c.k_cache.shape[2], max_query_heads(c.q)
    per_kv = c.q.shape[1] // kv_heads
    whole = c._asdict()
    for h in range(kv_heads):
        kv = slice(h, h + 1)
        for first in range(h * per_kv, (h + 1) * per_kv, group):
            heads = slice(first, min(first + group, (h + 1) * per_kv))
            paged_attention(**{
                **whole, "flash_prefill": flash_prefill, "q": c.q[:, heads],
                "k_cache": c.k_cache[:, :, kv], "v_cache": c.v_cache[:, :, kv],
                "out": c.out[:, heads], "k_scale": _kv_head(c.k_scale, kv),
                "v_scale": _kv_head(c.v_scale, kv),
                "sinks": None if c.sinks is None else c.sinks[heads],
                "alibi_slopes": None if c.alibi_slopes is None else c.alibi_slopes[heads],
            })  # fmt: skip


def _unified_launches(c: _Call) -> None:
    """``flash_prefill=False``: the decodes in the split-KV kernel where it splits (or where the
    batch is all decodes; never when batch-invariant), every other sequence in one launch of the
    unified kernel (batch-invariant: every row, with one config)."""
    num_seqs = c.seq_lens.shape[0]
    first_seq = 0
    if c.num_decodes > 0 and not c.batch_invariant:
        first_seq = _launch_decodes(c, decode_only=c.num_decodes == num_seqs)
    if first_seq < num_seqs:
        bucket = INVARIANT_QUERY_LEN if c.batch_invariant else c.max_query_len
        shape = {"head_dim": c.q.shape[2], "max_query_len": bucket}
        launch_unified_attention(
            **c.kernel_args(),
            first_seq=first_seq,
            first_token=first_seq,  # decodes have exactly one token each
            config=get_kernel_config("paged_attention", shape, c.out.device),
        )


def _launch_decodes(c: _Call, decode_only: bool) -> int:
    """Run the leading decodes through the split-KV kernel when it splits (or when the batch is
    all decodes); returns how many sequences it took (0: the unified kernel does them)."""
    max_seq_len = c.max_seq_len
    if c.sliding_window is not None:
        max_seq_len = min(max_seq_len, c.sliding_window)  # the keys a decode reads
    if c.attention_chunk is not None:
        max_seq_len = min(max_seq_len, c.attention_chunk)
    shape = {"head_dim": c.q.shape[2], "num_seqs": c.num_decodes, "max_seq_len": max_seq_len}
    cfg = get_kernel_config("decode_attention", shape, c.q.device)
    if c.num_kv_splits is not None:
        if c.num_kv_splits < 1 or c.num_kv_splits & (c.num_kv_splits - 1):
            raise ValueError(f"num_kv_splits must be a power of two, got {c.num_kv_splits}")
        splits = c.num_kv_splits
    else:
        splits = choose_num_splits(
            num_decodes=c.num_decodes,
            num_kv_heads=c.k_cache.shape[2],
            max_seq_len=max_seq_len,
            num_sms=num_sms(c.q.device),
            config=cfg,
        )
    if splits == 1 and not decode_only:
        return 0
    launch_decode_attention(
        **c.kernel_args(query_start_loc=False),
        num_decodes=c.num_decodes,
        num_splits=splits,
        config=cfg,
    )
    return c.num_decodes


def flash_configs(
    head_dim: int, max_query_len: int, device: torch.device | str | None, batch_invariant: bool
) -> tuple[dict, dict]:
    """(decode config, prefill config) of the prefill kernel. Batch-invariant: fixed buckets, and
    the prefill launch takes the decode config's ``TILE_SIZE`` so both visit the same tiles."""
    decode = get_kernel_config(FLASH, {"head_dim": head_dim, "max_query_len": 1}, device)
    bucket = INVARIANT_PREFILL_LEN if batch_invariant else max_query_len
    prefill = get_kernel_config(FLASH, {"head_dim": head_dim, "max_query_len": bucket}, device)
    if batch_invariant:
        prefill["TILE_SIZE"] = decode["TILE_SIZE"]
    return decode, prefill


def _flash_launches(c: _Call) -> None:
    """Decodes (split-KV, or the prefill kernel's decode launch when batch-invariant), then the
    other sequences in the prefill kernel."""
    num_seqs, num_tokens, num_decodes = c.seq_lens.shape[0], c.q.shape[0], c.num_decodes
    decode_cfg, prefill_cfg = flash_configs(
        c.q.shape[2], c.max_query_len, c.out.device, c.batch_invariant
    )
    if num_decodes > 0 and c.batch_invariant:
        launch_prefill_attention(
            **c.kernel_args(), first_seq=0, last_seq=num_decodes, first_token=0,
            last_token=num_decodes, config=decode_cfg, one_token_per_seq=True,
        )  # fmt: skip
    elif num_decodes > 0:
        _launch_decodes(c, decode_only=True)
    if num_decodes < num_seqs:
        launch_prefill_attention(
            **c.kernel_args(), first_seq=num_decodes, last_seq=num_seqs, first_token=num_decodes,
            last_token=num_tokens, config=prefill_cfg, image_spans=c.image_spans,
        )  # fmt: skip
