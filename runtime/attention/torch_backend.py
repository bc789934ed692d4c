"""Vectorized PyTorch paged attention: the CPU production path.

Decodes (one query each) use a block-ragged "flash-decoding" formulation: every context block of
every decode sequence is gathered once (no padding to the longest sequence), scored against its
sequence's query, and combined with a segment softmax (per-sequence max, then sums by
``index_add_``). Prefill chunks (few per step, many queries each) are padded into one batched
``scaled_dot_product_attention`` call with a causal-by-absolute-position mask. All index tensors
are built once per step in ``prepare``; nothing here reads a device value back to the host.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend, AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def prepare(self, meta: AttentionMetadata) -> None:
        """Gather indices and masks for the decode and prefill groups (device work only)."""
        bt = meta.block_tables
        bs = meta.block_size
        dev = bt.device
        nd = meta.num_decodes
        aux = meta.aux
        if nd:
            lens_host = meta.seq_lens_host[:nd]
            nblocks_host = [(n + bs - 1) // bs for n in lens_host]
            total = sum(nblocks_host)
            nblocks = torch.tensor(nblocks_host, dtype=torch.int64, device=dev)
            seq = torch.repeat_interleave(torch.arange(nd, device=dev), nblocks, output_size=total)
            starts = torch.cumsum(nblocks, 0) - nblocks
            offset = torch.arange(total, device=dev) - starts[seq]
            aux["dec_seq"] = seq
            aux["dec_blocks"] = bt[seq, offset].long()
            pos = offset[:, None] * bs + torch.arange(bs, device=dev)
            aux["dec_valid"] = (pos < meta.seq_lens[seq].unsqueeze(1).long())[:, None, None, :]
        npf = meta.num_prefills
        if npf:
            qlens = meta.query_lens_host[nd:]
            slens = meta.seq_lens_host[nd:]
            qmax, kmax_blocks = max(qlens), (max(slens) + bs - 1) // bs
            kmax = kmax_blocks * bs
            starts = meta.query_start_loc[nd:-1].long()
            j = torch.arange(qmax, device=dev)
            qlen_t = torch.tensor(qlens, dtype=torch.int64, device=dev)
            slen_t = meta.seq_lens[nd:].long()
            q_valid = j[None, :] < qlen_t[:, None]  # [P, Qmax]
            rows = (starts[:, None] + j[None, :]).clamp(max=meta.num_tokens - 1)
            aux["pf_rows"] = rows
            # padded (p, j) → flat index, in token order: prefill tokens are contiguous after decodes
            seq_of_tok = torch.repeat_interleave(
                torch.arange(npf, device=dev), qlen_t, output_size=meta.num_tokens - nd
            )
            tok = torch.arange(meta.num_tokens - nd, device=dev)
            aux["pf_flat"] = seq_of_tok * qmax + (tok - (starts - nd)[seq_of_tok])
            aux["pf_blocks"] = bt[nd:, :kmax_blocks].long()
            q_pos = (slen_t - qlen_t)[:, None] + j[None, :]  # absolute positions [P, Qmax]
            k_pos = torch.arange(kmax, device=dev)
            mask = k_pos[None, None, :] <= q_pos[:, :, None]
            mask |= ~q_valid[:, :, None]  # padded query rows see everything (avoids NaN)
            aux["pf_mask"] = mask.unsqueeze(1)  # [P, 1, Qmax, Kmax]

    def forward(self, q, k, v, k_cache, v_cache, meta):
        nb, bs, hkv, d = k_cache.shape
        slots = meta.slot_mapping
        k_cache.view(nb * bs, hkv, d).index_copy_(0, slots, k)
        v_cache.view(nb * bs, hkv, d).index_copy_(0, slots, v)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta)
        if meta.num_prefills:
            self._prefill(q, k_cache, v_cache, meta, out)
        return out

    def _decode(self, q, k_cache, v_cache, meta) -> torch.Tensor:
        aux = meta.aux
        seq, blocks, valid = aux["dec_seq"], aux["dec_blocks"], aux["dec_valid"]
        nd, h, d = q.shape
        hkv = self.num_kv_heads
        g = h // hkv
        kb = k_cache.index_select(0, blocks)  # [NB, bs, Hkv, D]
        vb = v_cache.index_select(0, blocks)
        qb = q.view(nd, hkv, g, d).index_select(0, seq)  # [NB, Hkv, G, D]
        # scores [NB, Hkv, G, bs]
        s = torch.matmul(qb, kb.permute(0, 2, 3, 1)).float() * self.scale
        s = s.masked_fill(~valid, float("-inf"))
        m_blk = s.amax(-1)  # [NB, Hkv, G]
        m_seq = torch.full((nd, hkv, g), float("-inf"), device=q.device)
        m_seq = m_seq.scatter_reduce(0, seq[:, None, None].expand_as(m_blk), m_blk, "amax")
        p = torch.exp(s - m_seq.index_select(0, seq).unsqueeze(-1))
        denom = torch.zeros((nd, hkv, g), device=q.device).index_add_(0, seq, p.sum(-1))
        o_blk = torch.matmul(p.to(vb.dtype), vb.transpose(1, 2)).float()  # [NB, Hkv, G, D]
        o = torch.zeros((nd, hkv, g, d), device=q.device).index_add_(0, seq, o_blk)
        return (o / denom.unsqueeze(-1)).to(q.dtype).view(nd, h, d)

    def _prefill(self, q, k_cache, v_cache, meta, out) -> None:
        aux = meta.aux
        p_blocks = aux["pf_blocks"]  # [P, KB]
        npf, kbmax = p_blocks.shape
        _, bs, hkv, d = k_cache.shape
        k = k_cache.index_select(0, p_blocks.reshape(-1)).view(npf, kbmax * bs, hkv, d)
        v = v_cache.index_select(0, p_blocks.reshape(-1)).view(npf, kbmax * bs, hkv, d)
        qp = q[aux["pf_rows"]]  # [P, Qmax, H, D]
        o = F.scaled_dot_product_attention(
            qp.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=aux["pf_mask"],
            scale=self.scale,
            enable_gqa=True,
        ).transpose(1, 2)  # [P, Qmax, H, D]
        nd = meta.num_decodes
        out[nd:] = o.reshape(-1, *o.shape[2:]).index_select(0, aux["pf_flat"])
