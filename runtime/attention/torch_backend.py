"""CPU paged attention, batch-invariant by construction, on one of two paths chosen per process.

**Kernel path** (default): ``pagoda.runtime.cpu.attention`` (C++, built on first use) reads K/V
in place from a packed cache layout, one code path for decode and prefill rows; see its
``csrc/attention/attention.cpp`` for the layout and why each row's result cannot depend on the
rest of the step. A window layer's rows read only their window's blocks there (each tile starts
at its first row's window), a chunked layer's (Llama 4) only their chunk's. ``allocate_kv_cache`` picks it when it builds and the shapes suit it
(bf16/float32/int8, head_dim and block_size multiples of 16, no attention soft cap, no
attention sinks, no latent cache: its layouts for K and V differ, and a latent cache is one
tensor); ALiBi's slopes (BLOOM, MPT) it adds itself, before each row's softmax;
``forward`` tells the paths apart by the cache's rank (5: packed).

**Torch path** (no compiler, ``PAGODA_CPU_ATTENTION=torch``), described below.
The KV cache is the backend's own layout, head-major ``[Hkv, num_blocks, block_size, D]`` in the
model's dtype, so that gathering a bucket's blocks yields ``[Hkv, B, Kp, D]``, directly the
operand of a batched GEMM: one copy of the keys per step (the gather) instead of three (gather,
convert, transpose). Decode reads K/V from memory, so bytes per element count: a float32 cache
(tried) made the offline benchmark 25% slower than this bf16 one.
A latent cache (`base.py`) is one such tensor: a bucket gathers its blocks once, as keys and
as values (``p @ rows``, of which the first ``latent`` columns are kept: cheaper than copying
a slice of them).
Sequences are gathered through their block tables into padded batches. To keep padding small
without a Python loop per sequence, sequences are grouped into a few *buckets* of similar size:
decodes sorted by context length, prefill chunks by query length, each cut at the split points that
minimise padded area plus a per-call cost. Every index tensor and mask is built once per step, in
``prepare``; nothing reads device values back to the host.

**Invariance.** Greedy output must not depend on what happens to be in the prefix cache, on how a
prompt was chunked, or on what else is in the batch. A fused SDPA kernel cannot promise that: its
blocking (and with it the rounding of each row) changes with the number of query rows, the key
length and the causal fast path. So every query row, whether it is a decode, part of a chunk on
cached context or part of a fresh prompt, goes through the same three steps:
``scores = q @ K^T`` (one GEMM row per query row and head, in the cache's dtype with float32
accumulation), ``softmax`` over the keys in float32, ``p @ V``, as Hugging Face's eager attention.
Measured on oneDNN/MKL builds, each of these gives a row bit-identical results whatever the other
rows are, provided (1) the GEMM has at least ``MIN_GEMM_ROWS`` rows (smaller ones take a GEMV path
with another summation order) and (2) the key length is padded to a multiple of ``KEY_ALIGN`` with
exact zeros after the softmax (masked keys contribute ``0 * v``, padded tails add ``+0``).
``tests/runtime/engine/test_invariance.py`` checks the end-to-end consequence on every machine the
suite runs on. The price is materialising the scores (bounded by ``MAX_SCORE_ELEMS`` per call,
and computed in row slices that each read keys only up to their last row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.attention.base import IMAGE_SPANS, AttentionBackend, AttentionMetadata
from pagoda.runtime.cpu import attention as cpu_kernel
from pagoda.runtime.cpu.host_memory import zeros

MAX_DECODE_BUCKETS = 3
MAX_PREFILL_BUCKETS = 4
DECODE_CALL_COST = 512  # padded rows one extra call is worth, for decodes
PREFILL_CALL_COST = 64  # prefill rows are expensive, so splitting pays off sooner
KEY_ALIGN = 16  # key lengths are padded to a multiple of this (vector tails change rounding)
MIN_GEMM_ROWS = 4  # fewer rows per GEMM take a GEMV path whose summation order differs
MAX_SCORE_ELEMS = 1 << 24  # float32 scores per call (64 MiB): longer prefills go in row slices
MAX_SLICE_ROWS = 256  # query rows per slice; a slice reads keys only up to its last row (causal)
PV_KEY_CHUNK = 256  # float32 p @ V sums keys in chunks of this many (see `_p_times_v`)
WINDOW_ALIGN = PV_KEY_CHUNK  # a window layer's keys start at a multiple of this (see `_plan`)


def plan_buckets(
    lengths: np.ndarray, max_buckets: int = MAX_DECODE_BUCKETS, call_cost: int = DECODE_CALL_COST
) -> list[int]:
    """Split ascending `lengths` into ≤ `max_buckets` runs minimising padded area + call cost.

    Returns the exclusive end index of each bucket (the last one is len(lengths)).
    """
    n = len(lengths)
    best_cost, best = n * int(lengths[-1]) + call_cost, [n]
    if n < 2 or max_buckets < 2:
        return best
    i = np.arange(1, n)
    two = i * lengths[i - 1] + (n - i) * lengths[-1] + 2 * call_cost
    k = int(two.argmin())
    if two[k] < best_cost:
        best_cost, best = int(two[k]), [int(i[k]), n]
    if max_buckets >= 3 and n >= 3:
        a = np.arange(1, n - 1)[:, None]
        b = np.arange(2, n)[None, :]
        three = a * lengths[a - 1] + (b - a) * lengths[b - 1] + (n - b) * lengths[-1]
        three = np.where(b > a, three + 3 * call_cost, np.iinfo(np.int64).max)
        ai, bi = np.unravel_index(int(three.argmin()), three.shape)
        if three[ai, bi] < best_cost:
            best_cost, best = int(three[ai, bi]), [int(a[ai, 0]), int(b[0, bi]), n]
    if max_buckets >= 4 and n >= 4 and len(best) == 3:
        # refine: split the costliest of the three buckets once more
        starts = [0, *best[:-1]]
        costs = [(e - s) * int(lengths[e - 1]) for s, e in zip(starts, best)]
        j = int(np.argmax(costs))
        s, e = starts[j], best[j]
        if e - s >= 2:
            sub = plan_buckets(lengths[s:e], 2, call_cost)
            if len(sub) == 2:
                best = sorted({*best, s + sub[0]})
    return best


def _row_spans(meta: AttentionMetadata) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The step's bidirectional image rows (`IMAGE_SPANS`: rows, first and last position)."""
    return meta.aux.get(IMAGE_SPANS)


@dataclass
class _Bucket:
    """One padded batch of sequences, attended in row slices of at most `rows_per_call` rows."""

    q_rows: torch.Tensor  # [B, Qp] step rows of each padded query (clamped to the sequence)
    src: torch.Tensor  # [n] flat indices into the padded output [B * Qp] that are real tokens
    dst: torch.Tensor  # [n] the step rows they belong to
    blocks: torch.Tensor  # [B, nblk] cache blocks (padded columns repeat the last one)
    mask: torch.Tensor  # [B, Qp, 1, Kp] float32, 0 where allowed and -inf elsewhere
    rel: torch.Tensor | None  # [B, Qp, 1, Kp] float32 key_pos - query_pos (ALiBi), or None
    # [B, Qp, 1, Kp] int64 query_pos - key_pos, 0 where masked (relative logits), or None
    dist: torch.Tensor | None
    key_len: np.ndarray  # [Qp // rows_per_call slices] keys each row slice needs (aligned)
    rows_per_call: int


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    kernel: cpu_kernel.CpuKernel | None = None  # chosen by allocate_kv_cache

    def prepare(self, meta: AttentionMetadata) -> None:
        """Plan the step: host index tensors for the kernel, or buckets, indices and masks (the
        window layers' buckets are planned on their first call, `_buckets`)."""
        if self.kernel is not None:
            if "qstart" in meta.aux:  # (planned by a backend of another shape: the same)
                return
            qlens = np.asarray(meta.query_lens_host, dtype=np.int32)
            meta.aux["qstart"] = torch.from_numpy(
                np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
            )
            meta.aux["seq_lens"] = torch.tensor(meta.seq_lens_host, dtype=torch.int32)
            return
        if "buckets" not in meta.aux:
            meta.aux["buckets"] = self._plan(meta, None)

    def _buckets(
        self, meta: AttentionMetadata, window: int | None, chunk: int | None = None
    ) -> list[_Bucket]:
        if window is None and chunk is None:
            return meta.aux["buckets"]
        key = ("buckets", window, chunk)
        if key not in meta.aux:
            meta.aux[key] = self._plan(meta, window, chunk)
        return meta.aux[key]

    def _plan(
        self, meta: AttentionMetadata, window: int | None, chunk: int | None = None
    ) -> list[_Bucket]:
        qlens = np.asarray(meta.query_lens_host, dtype=np.int64)
        slens = np.asarray(meta.seq_lens_host, dtype=np.int64)
        qstart = np.concatenate([[0], np.cumsum(qlens)[:-1]])
        # the first key each sequence reads: 0, or where its first query's window (or attention
        # chunk) starts, rounded down to WINDOW_ALIGN keys, so that a row's keys sit at the same
        # offsets in the score and p @ V chunks whatever the prefill chunk it came in
        first = np.zeros_like(slens)
        p0 = slens - qlens  # the first query's position
        if window is not None:
            first = np.maximum(p0 - window + 1, 0)
        if chunk is not None:
            first = np.maximum(first, p0 - p0 % chunk)
        spans = _row_spans(meta)
        if spans is not None:  # an image's first key, wherever its rows' windows start
            seq = np.searchsorted(qstart, spans[0], side="right") - 1
            np.minimum.at(first, seq, spans[1])
        first = first // WINDOW_ALIGN * WINDOW_ALIGN
        nd = meta.num_decodes
        buckets: list[_Bucket] = []
        plan = (qlens, slens, qstart, first, window, chunk, spans)
        if nd:
            order = np.argsort(slens[:nd] - first[:nd], kind="stable")
            padded = -(-(slens - first)[order] // KEY_ALIGN) * KEY_ALIGN
            buckets += self._make(meta, order, plan_buckets(padded), plan)
        prefills = np.arange(nd, len(qlens))
        if len(prefills):
            order = prefills[np.argsort(qlens[prefills], kind="stable")]
            ends = plan_buckets(qlens[order], MAX_PREFILL_BUCKETS, PREFILL_CALL_COST)
            buckets += self._make(meta, order, ends, plan)
        return buckets

    def _make(self, meta, order, ends, plan) -> list[_Bucket]:
        out, start = [], 0
        for end in ends:
            out.append(self._bucket(meta, order[start:end], *plan))
            start = end
        return out

    def _bucket(self, meta, seqs, qlens, slens, qstart, first, window, chunk, spans) -> _Bucket:
        bs, dev = meta.block_size, meta.block_tables.device
        ql, sl, f = qlens[seqs], slens[seqs], first[seqs]
        align = bs * KEY_ALIGN // math.gcd(bs, KEY_ALIGN)
        kp = int(-(-(sl - f).max() // align) * align)
        nblk = kp // bs
        group = self.num_heads // self.num_kv_heads
        min_rows = -(-MIN_GEMM_ROWS // group)  # query rows that make MIN_GEMM_ROWS GEMM rows
        qp = max(int(ql.max()), min_rows)
        # Row slices bound the score tensor; every slice has the same number of rows.
        cap = min(qp, MAX_SLICE_ROWS, MAX_SCORE_ELEMS // (len(seqs) * self.num_heads * kp))
        rows = max(min_rows, cap)
        qp = -(-qp // rows) * rows
        j = np.arange(qp)
        q_rows = qstart[seqs][:, None] + np.minimum(j[None, :], ql[:, None] - 1)
        valid = j[None, :] < ql[:, None]
        src = np.flatnonzero(valid.ravel())
        q_pos = (sl - ql)[:, None] + np.minimum(j[None, :], ql[:, None] - 1)  # [B, Qp]
        k_pos = f[:, None, None] + np.arange(kp)[None, None, :]  # [B, 1, Kp] absolute
        allowed = k_pos <= q_pos[:, :, None]
        if window is not None:
            allowed &= k_pos > q_pos[:, :, None] - window
        if chunk is not None:  # the query's own chunk only (Llama 4's chunked attention)
            allowed &= k_pos >= (q_pos - q_pos % chunk)[:, :, None]
        reach = q_pos
        if spans is not None:  # an image's rows also see its later rows (bidirectional)
            lo = np.full(meta.num_tokens, np.iinfo(np.int64).max)
            hi = np.full(meta.num_tokens, -1)
            lo[spans[0]], hi[spans[0]] = spans[1], spans[2]
            lo_q, hi_q = lo[q_rows][:, :, None], hi[q_rows][:, :, None]
            allowed |= (k_pos >= lo_q) & (k_pos <= hi_q)
            reach = np.maximum(q_pos, hi[q_rows])
        mask = np.where(allowed, np.float32(0), np.float32(-np.inf))[:, :, None, :]
        rel = None
        if self.alibi_slopes is not None:  # ALiBi's distances (0 where masked: no NaN)
            rel = np.where(allowed, k_pos - q_pos[:, :, None], 0).astype(np.float32)
            rel = torch.from_numpy(np.ascontiguousarray(rel[:, :, None, :])).to(dev)
        dist = None
        if self.rel_logits:  # relative logits' backward distances (0 where masked)
            dist = np.where(allowed, q_pos[:, :, None] - k_pos, 0)[:, :, None, :]
            dist = torch.from_numpy(np.ascontiguousarray(dist)).to(dev)
        cols = np.minimum(
            f[:, None] // bs + np.arange(nblk)[None, :], meta.block_tables.shape[1] - 1
        )
        rows_t = torch.from_numpy(seqs).to(dev)[:, None]
        blocks = meta.block_tables[rows_t, torch.from_numpy(cols).to(dev)]
        slice_end = np.arange(rows - 1, qp, rows)  # each slice needs keys up to its last row
        need = (np.maximum.accumulate(reach, axis=1)[:, slice_end] - f[:, None]).max(axis=0) + 1
        key_len = np.minimum(-(-need // KEY_ALIGN) * KEY_ALIGN, kp)
        return _Bucket(
            q_rows=torch.from_numpy(q_rows).to(dev),
            src=torch.from_numpy(src).to(dev),
            dst=torch.from_numpy(q_rows.ravel()[src]).to(dev),
            blocks=blocks.long(),
            mask=torch.from_numpy(np.ascontiguousarray(mask)).to(dev),
            rel=rel,
            dist=dist,
            key_len=key_len,
            rows_per_call=rows,
        )

    def allocate_kv_cache(self, num_blocks, block_size, model_dtype, device):
        """The kernel's packed layout when it can run (see ``attention.cpp``), else head-major
        ``[num_kv_heads, num_blocks, block_size, head_dim]``: gathering a bucket's blocks yields
        ``[Hkv, B, Kp, D]``, already the batched-GEMM operand (no transpose). int8 caches hold
        a float32 scale after each token's ``D`` values (torch path: ``[..., D + 4]`` rows)."""
        dt = self.cache_dtype(model_dtype)
        hkv, d = self.num_kv_heads, self.head_dim
        usable = dt in (torch.float32, torch.bfloat16, torch.int8)
        usable = usable and d % 16 == 0 and block_size % 16 == 0 and d <= 512
        # the kernel takes sliding windows and attention chunks (it reads only their blocks),
        # not soft caps or attention sinks: a model with either takes the torch path, as does a
        # latent cache
        usable = usable and self.softcap is None and not self.sinks and self.latent is None
        usable = usable and not self.rel_logits  # (relative logits: the torch path's alone)
        usable = usable and not self.image_spans  # (bidirectional image spans: the mask's)
        self.kernel = cpu_kernel.load() if usable and device.type == "cpu" else None
        if self.kernel is not None:
            k_shape, v_shape = cpu_kernel.packed_shapes(hkv, num_blocks, block_size, d, dt)
        else:
            k_shape = v_shape = (hkv, num_blocks, block_size, d + 4 * (dt == torch.int8))
        k_cache = zeros(k_shape, dt, device)
        if self.latent is not None:  # one tensor: its rows are the keys and hold the values
            return k_cache, k_cache
        return k_cache, zeros(v_shape, dt, device)

    def write_kv(self, k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
        """Store ``k``/``v`` ``[T, Hkv, D]`` at ``slots`` in this backend's cache layout (``k``
        alone in a latent cache)."""
        if self.kernel is not None:
            self.kernel.write_kv(k, v, k_cache, v_cache, slots)
            return
        hkv, nb, bs, width = k_cache.shape
        pairs = ((k, k_cache),) if self.latent is not None else ((k, k_cache), (v, v_cache))
        for x, cache in pairs:
            rows = quantize_rows(x) if cache.dtype == torch.int8 else x.to(cache.dtype)
            cache.view(hkv, nb * bs, width).index_copy_(1, slots, rows.transpose(0, 1))

    def read_kv(self, k_cache, v_cache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached k and v ``[*slots.shape, Hkv, D]`` at ``slots`` from the kernel's packed
        layout (K ``[Hkv, NB, D/P, BS, P]``, V ``[Hkv, NB, BS/P, D, P]``: attention.cpp) or the
        head-major one; 16/32-bit caches (a sparse attention's gather: Kolibri 1.1's)."""
        if self.kernel is not None:
            bs, p = k_cache.shape[3:]
            blk, off = slots // bs, slots % bs
            k = k_cache[:, blk, :, off, :]  # [*S, Hkv, D/P, P]
            return k.flatten(-2), v_cache[:, blk, off // p, :, off % p]
        hkv, nb, bs, d = k_cache.shape
        return tuple(c.view(hkv, nb * bs, d)[:, slots].movedim(0, -2) for c in (k_cache, v_cache))

    def forward(self, q, k, v, k_cache, v_cache, meta, window=None, kv_scales=None, sinks=None,
                chunk=None, store=True, rel_bias=None):  # fmt: skip
        if kv_scales is not None:  # get_attention_backend gives FP8 caches to Triton only
            raise ValueError("the torch attention backend has no FP8 KV cache")
        if sinks is not None and self.kernel is not None:  # allocate_kv_cache saw `self.sinks`
            raise ValueError("attention sinks need a backend built with sinks=True")
        if rel_bias is not None and not self.rel_logits:
            raise ValueError("relative-position logits need a backend built with rel_logits=True")
        if self.kernel is not None:  # the kernel's layout: it reads the cache in place
            if store:
                self.kernel.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            aux = meta.aux
            return self.kernel.attention(
                q, k_cache, v_cache, meta.block_tables, aux["qstart"], aux["seq_lens"], self.scale,
                window=window, chunk=chunk, alibi=self.alibi_slopes,
            )  # fmt: skip
        if store:
            self.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        hkv, _, bs, width = k_cache.shape
        latent = self.latent
        out = q.new_empty(*q.shape[:2], latent or q.shape[2])
        int8 = k_cache.dtype == torch.int8
        for bk in self._buckets(meta, window, chunk):
            b, nblk = bk.blocks.shape
            flat = bk.blocks.reshape(-1)
            kb = k_cache.index_select(1, flat).view(hkv, b, nblk * bs, width)
            kb = dequantize_rows(kb, q.dtype) if int8 else kb
            if latent is not None:  # one gather: the rows are the values (their first columns)
                vb = kb
            else:
                vb = v_cache.index_select(1, flat).view(hkv, b, nblk * bs, width)
                vb = dequantize_rows(vb, q.dtype) if int8 else vb
            rel = None if rel_bias is None else rel_bias[bk.q_rows]  # [B, Qp, H, E]
            sk = sinks if sinks is None or sinks.dim() == 1 else sinks[bk.q_rows]  # per token
            o = self._attend(q[bk.q_rows], kb, vb, bk, sk, latent, rel)
            out.index_copy_(0, bk.dst, o.reshape(-1, *o.shape[2:]).index_select(0, bk.src))
        return out

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bk: _Bucket, sinks=None,
        width: int | None = None, rel: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """[B, Qp, H, D] x [Hkv, B, Kp, D] and values [Hkv, B, Kp, Dv] → [B, Qp, H, Dv], in
        row slices; ``width``: only the first ``width`` columns of ``p @ v`` are kept (a latent
        cache's values, read from the whole rows: a slice of ``v`` would be copied).

        Both GEMMs run in the cache's dtype (float32 accumulation inside); the softmax runs in
        float32 on the scores, as Hugging Face's eager attention does; with ``sinks`` (float32
        [H]) each head's sink joins the denominator (`_softmax_with_sinks`); with ``rel``
        ([B, Qp, H, E] relative logits of each padded query row) each score gets its row's
        logit at the key's backward distance where that is below E (`base.py`).
        """
        b, qp, h, d = q.shape
        hkv, g, dv = k.shape[0], h // k.shape[0], width or v.shape[-1]
        # q * scale rounded to the cache dtype (one rounding of the float32 product, as q.float())
        qs = q * self.scale if q.dtype == k.dtype else (q.float() * self.scale).to(k.dtype)
        qs = qs.view(b, qp, hkv, g, d).permute(2, 0, 1, 3, 4)
        out = torch.empty(b, qp, hkv, g, dv, dtype=q.dtype, device=q.device)
        step = bk.rows_per_call
        if sinks is not None and sinks.dim() == 1:  # [Hkv, 1, 1, g, 1]: a head's sink, as the
            sinks = sinks.float().view(hkv, 1, 1, g, 1)  # scores' layout
        elif sinks is not None:  # [B, Qp, H]: each row's own (Inkling 2's) -> [Hkv, B, Qp, g, 1]
            sinks = sinks.float().view(b, qp, hkv, g).permute(2, 0, 1, 3).unsqueeze(-1)
        if rel is not None:  # [Hkv, B, Qp, g, E], as the scores' layout
            rel = rel.view(b, qp, hkv, g, rel.shape[-1]).permute(2, 0, 1, 3, 4)
        slopes = self.alibi_slopes
        if slopes is not None:  # [Hkv, 1, 1, g, 1], as the sinks
            slopes = slopes.to(device=q.device, dtype=torch.float32).view(hkv, 1, 1, g, 1)
        for i, r0 in enumerate(range(0, qp, step)):
            r1, n = min(r0 + step, qp), int(bk.key_len[i])
            rows = qs[:, :, r0:r1].reshape(hkv, b, (r1 - r0) * g, d)
            s = torch.matmul(rows, k[:, :, :n].transpose(-1, -2))
            s = s.view(hkv, b, r1 - r0, g, n).float()
            if self.softcap is not None:  # as Hugging Face's eager attention: before the mask
                s = torch.tanh(s.div_(self.softcap)).mul_(self.softcap)
            if slopes is not None:  # ALiBi: slope * (key_pos - query_pos)
                s = s.add_(slopes * bk.rel[:, r0:r1, :, :n])
            if rel is not None:  # each row's logit at the key's distance, 0 from E on
                s = s.add_(_relative_logits(rel[:, :, r0:r1], bk.dist[:, r0:r1, :, :n]))
            s = s.add_(bk.mask[:, r0:r1, :, :n])
            if sinks is not None and sinks.shape[2] != 1:  # (per row: this slice's)
                p = _softmax_with_sinks(s, sinks[:, :, r0:r1])
            else:
                p = torch.softmax(s, dim=-1) if sinks is None else _softmax_with_sinks(s, sinks)
            p = p.to(k.dtype).view(hkv, b, (r1 - r0) * g, n)
            o = _p_times_v(p, v[:, :, :n]).view(hkv, b, r1 - r0, g, v.shape[-1])
            out[:, r0:r1] = o[..., :dv].permute(1, 2, 0, 3, 4)
        return out.view(b, qp, h, dv)


def _relative_logits(rel: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """float32 [Hkv, B, r, g, n] biases: ``rel`` [Hkv, B, r, g, E] at ``dist`` [B, r, 1, n]
    (each key's backward distance from its row), zero at distances E and beyond."""
    e = rel.shape[-1]
    idx = dist.clamp(max=e - 1).unsqueeze(0).expand(*rel.shape[:-1], dist.shape[-1])
    out = rel.gather(-1, idx).float()
    return out.masked_fill_((dist >= e).unsqueeze(0), 0.0)


def _softmax_with_sinks(s: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of float32 scores ``s`` with ``sinks`` (broadcast to ``s``'s
    rows) in each denominator: ``exp(s - m) / (sum exp(s - m) + exp(sink - m))``, ``m`` the
    larger of the row's max and its sink (Hugging Face's eager gpt-oss attention, which drops
    the sink's column after the softmax). Masked keys (-inf) add exact zeros, as in `softmax`."""
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sinks)
    e = torch.exp(s - m)
    return e.div_(e.sum(dim=-1, keepdim=True).add_(torch.exp(sinks - m)))


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` → int8 ``[..., D + 4]``: D values scaled by 127 / absmax, rounded to nearest
    even, then the float32 scale (absmax / 127) as 4 bytes; what the C++ kernel stores."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    full = torch.full_like(amax, 127.0)  # tensor / tensor: a true division, as the kernel's
    inv = torch.where(amax > 0, full / amax, torch.zeros_like(amax))
    q = torch.round(x * inv).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q, (amax / full).view(torch.int8)], dim=-1)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 ``[..., D + 4]`` rows of `quantize_rows` → ``[..., D]`` values in `dtype`."""
    scale = rows[..., -4:].contiguous().view(torch.float32)
    return (rows[..., :-4].float() * scale).to(dtype)


def _p_times_v(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``p @ v`` over the keys. float32 goes in fixed chunks of ``PV_KEY_CHUNK`` keys summed in
    order: MKL's float32 GEMM blocks the summed dimension by its length (on AVX-512 Xeons), so a
    row's bits would depend on how many padded keys its batch-mates add; with every chunk
    starting at the same key and holding at most one block, they cannot (the tail adds +0).
    bf16 (oneDNN, float32 accumulation inside one call) keeps one call: per-chunk results would
    round to bf16."""
    n = v.shape[-2]
    if v.dtype != torch.float32 or n <= PV_KEY_CHUNK:
        return torch.matmul(p, v)
    out = torch.matmul(p[..., :PV_KEY_CHUNK], v[..., :PV_KEY_CHUNK, :])
    for c in range(PV_KEY_CHUNK, n, PV_KEY_CHUNK):
        out.add_(torch.matmul(p[..., c : c + PV_KEY_CHUNK], v[..., c : c + PV_KEY_CHUNK, :]))
    return out
