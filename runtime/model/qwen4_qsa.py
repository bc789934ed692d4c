"""Qwen4-Exp's QSA indexer and the sparse attention it selects (transformers'
`Qwen4ExpTextQSAIndexer`), batched over the step:

- a token's raw indexer key (``index_qk_proj``'s last ``indexer_head_dim`` columns, before any
  norm) is cached per KV-cache slot in the layer's key table [slots, D] (`side_tables`,
  counted in the KV budget; written at the step's ``slot_mapping``, so prefix hits, chunked
  prefill and preemption read the keys of the blocks they read the KV rows of); its queries are ``q_layernorm`` (1 + w) of the first columns,
  rotated at the token's position;
- a sequence's positions are cut into blocks of ``indexer_compress_ratio`` from its first
  token; a block's key is the float32 mean of its tokens' raw keys (in the model's dtype),
  ``k_layernorm``-ed and rotated at the block's first position, computed once, by the step
  whose token ends the block, into the layer's block table (`side_tables.PoolTable`, by the
  block's last KV slot: a step pools only the blocks its tokens end). A query at position p scores
  the whole blocks that end at or before p (``sum_h relu(q_h . key) / sqrt(D)``, float32),
  keeps its ``indexer_budget // indexer_compress_ratio`` best and the tail [nb C, p] (nb: its
  whole blocks);
- while no sequence of the step is longer than (blocks + 1) x ratio - 1 every query keeps every
  earlier token: the step attends densely through the backend (the key table still written);
  else each query attends to its kept slots only (`sparse_gqa`: the K/V rows gathered from the
  backend's cache layout, the softmax in float32 as transformers' eager attention). Blocks whose
  scores tie exactly may be kept in another order than transformers' picks.
"""

from __future__ import annotations

import math

import torch
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.dsa import MAX_SCORE_ELEMS, index_plan
from pagoda.runtime.model.qwen4_exp_config import Qwen4Exp
from pagoda.runtime.model.side_tables import PoolTable, SlotTable

POSITIONS = "qwen4_positions"  # `meta.aux`: the step's token positions (int64 [T])


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    y = x.float()
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def _rotate(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``x`` [..., D] rotated (halves, transformers' ``rotate_half``) on its first r dims at
    ``positions`` [...] (``cache``: [max_pos, r] rows of cat(cos, sin))."""
    cs = cache[positions].to(x.dtype)
    r = cs.shape[-1]
    cos, sin = cs.unsqueeze(-2).chunk(2, dim=-1) if x.dim() > cs.dim() else cs.chunk(2, dim=-1)
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], dim=-1)


class QsaIndexer:
    """One attention layer's QSA indexer (module docstring)."""

    def __init__(self, w: DeviceWeights, prefix: str, q: Qwen4Exp, eps: float, ctx,
                 rope: torch.Tensor):  # fmt: skip
        p = prefix + "self_attn.indexer."
        self.heads, self.dim, self.eps, self.rope = q.indexer_heads, q.indexer_dim, eps, rope
        self.ratio, self.blocks, self.dense_limit = (
            q.indexer_ratio,
            q.indexer_blocks,
            q.indexer_dense_limit,
        )
        self.proj = ctx.linear(w[p + "index_qk_proj.weight"])
        dev = w.device
        self.q_norm = 1 + w.source(p + "q_layernorm.weight").float().to(dev)
        self.k_norm = 1 + w.source(p + "k_layernorm.weight").float().to(dev)
        self.keys = SlotTable(self.dim)  # each cached token's raw key (`side_tables`)
        self.blocks_table = PoolTable(self.ratio, self.dim)  # each finished block's key

    def linears(self) -> list:
        return [self.proj]

    def query_and_store(self, x: torch.Tensor, meta: AttentionMetadata, cache: torch.Tensor,
                        slots: int):  # fmt: skip
        """The rotated queries [T, H, D]; the raw keys stored at the step's slots of the key
        table that goes with the layer's KV ``cache`` (of ``slots`` slots at most: a new
        cache, a new engine's, gets a new table)."""
        t, d = x.shape[0], self.dim
        q, k = self.proj(x).split([self.heads * d, d], dim=-1)
        self.keys.bind(cache, slots, x.dtype)
        self.keys.write(meta.slot_mapping, k)
        self.blocks_table.bind(cache, slots, x.dtype, meta.block_size)
        self.blocks_table.close(meta, self._block_keys)
        q = _rms(q.view(t, self.heads, d), self.q_norm, self.eps)
        return _rotate(q, self.rope, meta.aux[POSITIONS])

    def _block_keys(self, slots: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """The key [N, D] of each block of cache ``slots`` [N, ratio] starting at position
        ``first`` [N]: its raw keys' float32 mean (in the model's dtype), normed, rotated."""
        raw = self.keys.rows[slots]
        pooled = _rms(raw.float().mean(dim=1).to(raw.dtype), self.k_norm, self.eps)
        return _rotate(pooled, self.rope, first)

    def select(self, q: torch.Tensor, meta: AttentionMetadata):
        """(slots [T, k], kept [T, k]) of each token's kept cache slots (module docstring),
        k = blocks x ratio + ratio - 1."""
        plan = index_plan(meta)
        b, qp = plan.q_rows.shape
        h, d, c = self.heads, self.dim, self.ratio
        n = plan.slots.shape[1] // c  # whole blocks in the longest context
        keys = self.blocks_table.gather(plan.slots, n).float().transpose(1, 2)  # [B, D, n]
        starts = torch.arange(n, device=q.device) * c
        qb = q[plan.q_rows].float()  # [B, Q, H, D]
        ends = starts + c - 1
        k = min(self.blocks, n)
        best = torch.empty(b, qp, k, dtype=torch.long, device=q.device)
        kept = torch.empty(b, qp, k, dtype=torch.bool, device=q.device)
        step = max(1, MAX_SCORE_ELEMS // (b * h * max(n, 1)))
        for r0 in range(0, qp, step):  # row slices bound the [B, rows, H, blocks] products
            r1 = min(r0 + step, qp)
            s = torch.matmul(qb[:, r0:r1].reshape(b, -1, d), keys).view(b, r1 - r0, h, n)
            scores = s.relu_().sum(dim=2) / math.sqrt(d)
            scores.masked_fill_(ends > plan.q_pos[:, r0:r1], float("-inf"))
            top = scores.topk(k, dim=-1)
            best[:, r0:r1], kept[:, r0:r1] = top.indices, top.values > float("-inf")
        offsets = torch.arange(c, device=q.device)
        pos = (best[..., None] * c + offsets).flatten(-2)  # [B, Q, k C]
        kept = kept[..., None].expand(b, qp, k, c).flatten(-2)
        tail = torch.div(plan.q_pos + 1, c, rounding_mode="floor") * c + offsets[:-1]
        pos = torch.cat([pos, tail], dim=-1)
        kept = torch.cat([kept, tail <= plan.q_pos], dim=-1)
        pos = pos.clamp_(max=plan.slots.shape[1] - 1).view(b, -1)
        slots = plan.slots.gather(1, pos).view(b * qp, -1)
        return slots.index_select(0, plan.src), kept.view(b * qp, -1).index_select(0, plan.src)


def sparse_gqa(q, backend, k_cache, v_cache, slots, kept, scale: float) -> torch.Tensor:
    """Attention of each token ``q`` [T, H, D] over its kept cache slots only (``slots`` /
    ``kept`` [T, k]) → [T, H, D], in token slices, the softmax in float32."""
    t, h, d = q.shape
    k = slots.shape[1]
    hkv = backend.num_kv_heads
    g = h // hkv
    out = q.new_empty(t, h, d)
    n = max(1, MAX_SCORE_ELEMS // (k * h * 4))
    for t0 in range(0, t, n):
        t1 = min(t0 + n, t)
        keys, values = backend.read_kv(k_cache, v_cache, slots[t0:t1].reshape(-1))
        keys = keys.view(t1 - t0, k, hkv, d).to(q.dtype)
        values = values.view(t1 - t0, k, hkv, d).to(q.dtype)
        qs = q[t0:t1].view(t1 - t0, hkv, g, d)
        s = torch.einsum("nhgd,nkhd->nhgk", qs, keys).float() * scale
        s.masked_fill_(~kept[t0:t1, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype)
        out[t0:t1] = torch.einsum("nhgk,nkhd->nhgd", p, values).reshape(t1 - t0, h, d)
    return out
