"""Vectorized PyTorch paged attention: the CPU production path.

Sequences are gathered through their block tables into padded batches and handed to
``scaled_dot_product_attention`` (whose CPU kernel is a flash-attention loop with native GQA).
To keep padding small without a Python loop per sequence, decodes are sorted by context length
and cut into at most `MAX_DECODE_BUCKETS` buckets at the split points that minimise padded
area; prefill chunks (few per step) form one padded batch with a causal-by-absolute-position
mask. All index tensors are built once per step in ``prepare``; nothing reads device values back.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend, AttentionMetadata

MAX_DECODE_BUCKETS = 3
BUCKET_OVERHEAD_ROWS = 512  # padded rows one extra SDPA call is worth (per-call overhead)


def plan_buckets(lengths: np.ndarray, max_buckets: int = MAX_DECODE_BUCKETS) -> list[int]:
    """Split points over ascending `lengths` minimising padded area + per-bucket overhead.

    Returns the exclusive end index of each bucket (the last one is len(lengths)).
    """
    n = len(lengths)
    best_cost, best = n * int(lengths[-1]) + BUCKET_OVERHEAD_ROWS, [n]
    if n < 2 or max_buckets < 2:
        return best
    i = np.arange(1, n)
    two = i * lengths[i - 1] + (n - i) * lengths[-1] + 2 * BUCKET_OVERHEAD_ROWS
    k = int(two.argmin())
    if two[k] < best_cost:
        best_cost, best = int(two[k]), [int(i[k]), n]
    if max_buckets >= 3 and n >= 3:
        a = np.arange(1, n - 1)[:, None]
        b = np.arange(2, n)[None, :]
        three = a * lengths[a - 1] + (b - a) * lengths[b - 1] + (n - b) * lengths[-1]
        three = np.where(b > a, three + 3 * BUCKET_OVERHEAD_ROWS, np.iinfo(np.int64).max)
        ai, bi = np.unravel_index(int(three.argmin()), three.shape)
        if three[ai, bi] < best_cost:
            best = [int(a[ai, 0]), int(b[0, bi]), n]
    return best


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def prepare(self, meta: AttentionMetadata) -> None:
        """Gather indices and masks for decode buckets and the prefill batch."""
        bs, dev, nd = meta.block_size, meta.block_tables.device, meta.num_decodes
        buckets = []
        if nd:
            lens = np.asarray(meta.seq_lens_host[:nd], dtype=np.int64)
            order = np.argsort(lens, kind="stable")
            padded = (lens[order] + bs - 1) // bs * bs
            start = 0
            for end in plan_buckets(padded):
                rows = torch.from_numpy(order[start:end]).to(dev)
                nblk = int(padded[end - 1]) // bs
                blocks = meta.block_tables.index_select(0, rows)[:, :nblk].long()
                kpos = torch.arange(nblk * bs, device=dev)
                mask = kpos[None, :] < meta.seq_lens.index_select(0, rows)[:, None]
                buckets.append((rows, blocks, mask[:, None, None, :]))
                start = end
        meta.aux["decode_buckets"] = buckets
        if meta.num_prefills:
            self._prepare_prefill(meta)

    def _prepare_prefill(self, meta: AttentionMetadata) -> None:
        bs, dev, nd, aux = meta.block_size, meta.block_tables.device, meta.num_decodes, meta.aux
        qlens = meta.query_lens_host[nd:]
        npf, qmax = len(qlens), max(qlens)
        kmax_blocks = (max(meta.seq_lens_host[nd:]) + bs - 1) // bs
        starts = meta.query_start_loc[nd:-1].long()
        j = torch.arange(qmax, device=dev)
        qlen_t = torch.tensor(qlens, dtype=torch.int64, device=dev)
        q_valid = j[None, :] < qlen_t[:, None]  # [P, Qmax]
        aux["pf_rows"] = (starts[:, None] + j[None, :]).clamp(max=meta.num_tokens - 1)
        # padded (p, j) → flat index, in token order: prefill tokens are contiguous after decodes
        n_pf_tokens = meta.num_tokens - nd
        seq_of_tok = torch.repeat_interleave(
            torch.arange(npf, device=dev), qlen_t, output_size=n_pf_tokens
        )
        tok = torch.arange(n_pf_tokens, device=dev)
        aux["pf_flat"] = seq_of_tok * qmax + (tok - (starts - nd)[seq_of_tok])
        # Fresh prompts (no cached context): the step's own K/V are the whole context, so skip
        # the cache gather and let SDPA apply a plain causal mask (it skips masked tiles).
        aux["pf_fresh"] = meta.seq_lens_host[nd:] == qlens
        if aux["pf_fresh"]:
            return
        aux["pf_blocks"] = meta.block_tables[nd:, :kmax_blocks].long()
        q_pos = (meta.seq_lens[nd:].long() - qlen_t)[:, None] + j[None, :]  # absolute [P, Qmax]
        mask = torch.arange(kmax_blocks * bs, device=dev)[None, None, :] <= q_pos[:, :, None]
        mask |= ~q_valid[:, :, None]  # padded query rows see everything (avoids NaN)
        aux["pf_mask"] = mask.unsqueeze(1)  # [P, 1, Qmax, Kmax]

    def forward(self, q, k, v, k_cache, v_cache, meta):
        nb, bs, hkv, d = k_cache.shape
        slots = meta.slot_mapping
        k_cache.view(nb * bs, hkv, d).index_copy_(0, slots, k)
        v_cache.view(nb * bs, hkv, d).index_copy_(0, slots, v)
        out = torch.empty_like(q)
        for rows, blocks, mask in meta.aux["decode_buckets"]:
            out.index_copy_(
                0,
                rows,
                self._attend(
                    q.index_select(0, rows).unsqueeze(1), blocks, mask, k_cache, v_cache
                ).squeeze(1),
            )
        if meta.num_prefills:
            aux = meta.aux
            rows = aux["pf_rows"]
            if aux["pf_fresh"]:
                o = self._sdpa(q[rows], k[rows], v[rows], None)
            else:
                o = self._attend(q[rows], aux["pf_blocks"], aux["pf_mask"], k_cache, v_cache)
            out[meta.num_decodes :] = o.reshape(-1, *o.shape[2:]).index_select(0, aux["pf_flat"])
        return out

    def _attend(self, q, blocks, mask, k_cache, v_cache) -> torch.Tensor:
        """q [B, Q, H, D] against the gathered blocks [B, nblk] → [B, Q, H, D]."""
        b, nblk = blocks.shape
        _, bs, hkv, d = k_cache.shape
        flat = blocks.reshape(-1)
        k = k_cache.index_select(0, flat).view(b, nblk * bs, hkv, d)
        v = v_cache.index_select(0, flat).view(b, nblk * bs, hkv, d)
        return self._sdpa(q, k, v, mask)

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
