"""Vectorized PyTorch paged attention: the CPU production path.

Sequences are gathered through their block tables into padded batches and handed to
``scaled_dot_product_attention`` (whose CPU kernel is a flash-attention loop with native GQA).
To keep padding small without a Python loop per sequence, sequences are grouped into a few
*buckets* of similar size: decodes sorted by context length, prefill chunks by query length,
each cut at the split points that minimise padded area plus a per-call cost. A bucket of fresh
prompts (no cached context) attends its own K/V with a causal SDPA, which skips masked tiles and
needs no cache gather; other buckets read the cache with an additive causal-by-position mask.
Every index tensor and mask is built once per step, in ``prepare`` (masks on first use, in the
model's dtype); nothing reads device values back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend, AttentionMetadata

MAX_DECODE_BUCKETS = 3
MAX_PREFILL_BUCKETS = 4
DECODE_CALL_COST = 512  # padded rows one extra SDPA call is worth, for decodes
PREFILL_CALL_COST = 64  # prefill rows are expensive, so splitting pays off sooner


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


@dataclass
class _Bucket:
    q_rows: torch.Tensor  # [B, Qmax] step rows of each padded query (clamped to the sequence)
    src: torch.Tensor  # [n] flat indices into the padded output [B * Qmax] that are real tokens
    dst: torch.Tensor  # [n] the step rows they belong to
    blocks: torch.Tensor | None  # [B, nblk] cache blocks; None: fresh prompts, use the step's K/V
    allowed: torch.Tensor | None  # [B, 1, Qmax or 1, nblk * block_size] bool; None: plain causal
    mask: torch.Tensor | None = None  # additive form of `allowed`, made on first use


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def prepare(self, meta: AttentionMetadata) -> None:
        """Plan the step's buckets and build their indices and masks."""
        qlens = np.asarray(meta.query_lens_host, dtype=np.int64)
        slens = np.asarray(meta.seq_lens_host, dtype=np.int64)
        qstart = np.concatenate([[0], np.cumsum(qlens)[:-1]])
        nd, bs = meta.num_decodes, meta.block_size
        buckets: list[_Bucket] = []
        if nd:
            order = np.argsort(slens[:nd], kind="stable")
            padded = (slens[order] + bs - 1) // bs * bs
            buckets += self._make(meta, order, plan_buckets(padded), qlens, slens, qstart)
        prefills = np.arange(nd, len(qlens))
        fresh = qlens[prefills] == slens[prefills]
        for group in (prefills[fresh], prefills[~fresh]):  # never mix the two kinds
            if len(group):
                order = group[np.argsort(qlens[group], kind="stable")]
                ends = plan_buckets(qlens[order], MAX_PREFILL_BUCKETS, PREFILL_CALL_COST)
                buckets += self._make(meta, order, ends, qlens, slens, qstart)
        meta.aux["buckets"] = buckets

    @staticmethod
    def _make(meta, order, ends, qlens, slens, qstart) -> list[_Bucket]:
        bs, dev = meta.block_size, meta.block_tables.device
        out, start = [], 0
        for end in ends:
            seqs = order[start:end]
            start = end
            ql, sl = qlens[seqs], slens[seqs]
            qmax = int(ql.max())
            j = np.arange(qmax)
            q_rows = qstart[seqs][:, None] + np.minimum(j[None, :], ql[:, None] - 1)
            valid = (j[None, :] < ql[:, None]).ravel()
            src = np.flatnonzero(valid)
            blocks = allowed = None
            if qmax == 1 or not np.array_equal(ql, sl):  # some context lives in the cache
                nblk = int((sl.max() + bs - 1) // bs)
                q_pos = (sl - ql)[:, None] + j[None, :]  # absolute positions [B, Qmax]
                ok = np.arange(nblk * bs)[None, None, :] <= q_pos[:, :, None]
                ok[~valid.reshape(len(seqs), qmax)] = True  # padded rows see everything (no NaN)
                blocks = meta.block_tables[torch.from_numpy(seqs).to(dev), :nblk].long()
                allowed = torch.from_numpy(ok).to(dev).unsqueeze(1)
            out.append(
                _Bucket(
                    q_rows=torch.from_numpy(q_rows).to(dev),
                    src=torch.from_numpy(src).to(dev),
                    dst=torch.from_numpy(q_rows.ravel()[src]).to(dev),
                    blocks=blocks,
                    allowed=allowed,
                )
            )
        return out

    def forward(self, q, k, v, k_cache, v_cache, meta):
        nb, bs, hkv, d = k_cache.shape
        k_cache.view(nb * bs, hkv, d).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(nb * bs, hkv, d).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        for bk in meta.aux["buckets"]:
            qb = q[bk.q_rows]  # [B, Qmax, H, D]
            if bk.blocks is None:
                o = self._sdpa(qb, k[bk.q_rows], v[bk.q_rows], None)
            else:
                if bk.mask is None:
                    bk.mask = torch.zeros(bk.allowed.shape, dtype=q.dtype, device=q.device)
                    bk.mask.masked_fill_(~bk.allowed, float("-inf"))
                b, nblk = bk.blocks.shape
                flat = bk.blocks.reshape(-1)
                kb = k_cache.index_select(0, flat).view(b, nblk * bs, hkv, d)
                vb = v_cache.index_select(0, flat).view(b, nblk * bs, hkv, d)
                o = self._sdpa(qb, kb, vb, bk.mask)
            out.index_copy_(0, bk.dst, o.reshape(-1, *o.shape[2:]).index_select(0, bk.src))
        return out

    def _sdpa(self, q, k, v, mask) -> torch.Tensor:
        """[B, Q, H, D] x [B, K, Hkv, D] → [B, Q, H, D]; no mask means causal from position 0."""
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )
        return o.transpose(1, 2)
