"""DeepSeek Sparse Attention (`DeepseekV32ForCausalLM`: DeepSeek-V3.2; `GlmMoeDsaForCausalLM`:
GLM-5; `Dots3NoteForCausalLM`: Dots3 Note's text model, with Dots3's attention in
`deepseek.DeepseekLayer`; A.X-K2: model/axk2.py): DeepSeek-V3's latent attention (`deepseek.DeepseekLayer`) in which each query attends
to at most ``index_topk`` earlier tokens of its sequence, picked by a lightning indexer
(`model_configs.IndexerConfig`), as transformers' ``DeepseekV32Indexer`` computes it:

- the indexer's query ``wq_b(q_bottleneck)``: ``index_n_heads`` heads of ``index_head_dim``
  from the attention's normed q bottleneck; its key ``LayerNorm(wk(x))`` (weight and bias, eps
  1e-6), one per token shared by every index head; the first ``qk_rope_head_dim`` dims of both
  rotated with the model's rotary table (rotate-half on V3.2, interleaved pairs on GLM-5:
  de-interleaved first, as the main attention's, so that every q . k is the same);
- a token's score for key j: ``sum_h w_h * relu(q_h . k_j / sqrt(index_head_dim))`` with
  ``w = weights_proj(x) / sqrt(index_n_heads)`` (float32, as transformers keeps
  ``weights_proj``), the products in float32; the ``index_topk`` best of the keys at or before
  the token's position are kept (all of them while there are no more);
- the attention: the absorbed form over the kept rows only (a softmax over them, the rest
  weigh 0, as transformers' mask over its dense attention gives).

transformers computes the indexer in bf16 / float32: DeepSeek's own kernels quantize q and k to
FP8 and rotate them by a Hadamard transform first (an orthogonal map: the products are the
same up to the FP8 rounding). This file matches transformers, not the FP8 kernels.

**The indexer's keys live in the latent cache**: each row is ``[normed latent | rotary key |
indexer key]`` (`MlaConfig.cache_width`: 512 + 64 + 128 on V3.2, in the model's dtype), so the
prefix cache, preemption, the block accounting and the memory estimates see them as the rest of
the row. The dense attention's query carries zeros over those columns (they add +0 to every
score and the values are the first ``kv_lora_rank`` columns: `attention/base.py`).

**A step** where no sequence is longer than ``index_topk`` attends densely through the attention
backend (the indexer's keys are written, nothing scored: every token is kept). Past it the
whole step goes sparse, batched in torch: each sequence's indexer keys are gathered through its
block table into a padded ``[B, K, D]``, the queries into ``[B, Q, H, D]``, the scores (float32)
of each row slice ``[B, n, K]`` masked causally and reduced by ``topk`` to the kept positions
and their cache slots; each token's kept rows ``[k, W]`` are gathered from the cache and attended.
The row writes go straight into the cache (its rows are ``view(-1, W)`` in every backend's
layout: one KV head), which is why a DSA model takes the model's dtype for its cache.
GLM-5's "shared" layers (`IndexerConfig.full_layers`) reuse the previous full layer's slots.

**Tensor parallelism** splits the heads as DeepSeek-V3's (`deepseek.py`); the indexer is whole
on every rank (its projections replicated, its keys in each rank's whole latent row), so every
rank keeps the same tokens.

Not supported (refused in one line): ``--quantization fp8`` and FP8/int8 KV caches
(`engine/start_checks.check_dtype`); CUDA graphs are off
for these models (the step's dense or sparse path is chosen on the host). A step's path is
chosen by its longest sequence, so a short sequence's bits may differ with the batch it is in
(the same tokens are kept either way; the dense and sparse paths round differently).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.attention.torch_backend import _softmax_with_sinks
from pagoda.runtime.model.deepseek import DeepseekLayer, DeepseekModel, _rotary_dims
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step, linear_layer

PLAN = "dsa_plan"  # `meta.aux`: the step's `IndexPlan`
KEPT = "dsa_kept"  # `meta.aux`: the last full layer's (slots [T, k], kept [T, k])
MAX_SCORE_ELEMS = 1 << 24  # float32 scores per slice (64 MiB)


@dataclass
class IndexPlan:
    """A step's sequences padded to ``[B, Q]`` queries and ``[B, K]`` context positions."""

    q_rows: torch.Tensor  # [B, Q] step row of each padded query (clamped to its sequence)
    q_pos: torch.Tensor  # [B, Q, 1] its position (a key at a later one is masked)
    src: torch.Tensor  # [T] the flat padded index of each step row, in step order
    slots: torch.Tensor  # int64 [B, K] cache slot of each context position (0 past the end)


def index_plan(meta: AttentionMetadata) -> IndexPlan:
    """`IndexPlan` of the step, built once (host lengths, the block table on the device)."""
    plan = meta.aux.get(PLAN)
    if plan is not None:
        return plan
    qlens = np.asarray(meta.query_lens_host, dtype=np.int64)
    slens = np.asarray(meta.seq_lens_host, dtype=np.int64)
    qp, kp, bs = int(qlens.max()), int(slens.max()), meta.block_size
    qstart = np.concatenate([[0], np.cumsum(qlens)[:-1]])
    j = np.minimum(np.arange(qp)[None, :], qlens[:, None] - 1)
    q_pos = (slens - qlens)[:, None] + j
    src = np.flatnonzero((np.arange(qp)[None, :] < qlens[:, None]).ravel())
    dev, table = meta.block_tables.device, meta.block_tables
    pos = torch.arange(kp, device=dev)
    cols = (pos // bs).clamp_(max=table.shape[1] - 1)
    slots = table[:, cols].long() * bs + pos % bs
    plan = IndexPlan(
        q_rows=_to(qstart[:, None] + j, dev),
        q_pos=_to(q_pos[:, :, None], dev),
        src=_to(src, dev),
        slots=slots,
    )
    meta.aux[PLAN] = plan
    return plan


def _to(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    """`a` on `dev`: through pinned memory to a GPU (no pageable copy: no sync)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dev.type == "cpu" else t.pin_memory().to(dev, non_blocking=True)


class DsaLayer(DeepseekLayer):
    """DeepSeek-V3's latent attention layer with the lightning indexer (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        ix = self.ix = self.mla.indexer
        self.full = ix.full_layers[index]
        self.wq_b = self.wk = self.weights_proj = self.k_norm = None
        if self.full:
            p = prefix + "self_attn.indexer."
            self.wq_b = linear_layer(ctx, w, [p + "wq_b.weight"])
            self.wk = linear_layer(ctx, w, [p + "wk.weight"])
            self.k_norm = (w[p + "k_norm.weight"], w[p + "k_norm.bias"])
            # float32, as transformers keeps it (`_keep_in_fp32_modules`), as the router
            self.weights_proj = ctx.linear(w.source(p + "weights_proj.weight").float())

    def linears(self):
        mine = [x for x in (self.wq_b, self.wk) if x is not None]
        return [*super().linears(), *mine]

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        m, ix, meta = self.mla, self.ix, step.meta
        cr = m.kv_lora_rank + m.qk_rope_head_dim
        q_full, k_full, bottleneck, gate = self.project(x, step, ix.head_dim)
        q_index = None
        if self.full:  # the indexer's key into the row's last columns
            q_index = self._index_query_and_key(x, bottleneck, k_full[:, 0, cr:], step)
        else:  # a shared layer's row has no indexer key: zeros (0 x garbage may be NaN)
            k_full[:, 0, cr:] = 0
        k_cache, v_cache = step.kv_caches[self.index]
        if meta.max_seq_len <= ix.topk:  # every token kept: the backend's dense attention
            out = self.ctx.backend.forward(
                q_full, k_full, k_full, k_cache, v_cache, meta, window=None,
                kv_scales=self.kv_scales,
            )  # fmt: skip
            return self.values(out, gate)
        rows = k_cache.view(-1, k_cache.shape[-1])  # one KV head: [slots, W] in any layout
        rows.index_copy_(0, meta.slot_mapping, k_full[:, 0].to(rows.dtype))
        if self.full:
            meta.aux[KEPT] = self._select(q_index, x, rows[:, cr:], meta)
        slots, kept = meta.aux[KEPT]
        out = sparse_attention(q_full[..., :cr], rows, slots, kept, self.ctx.backend.scale,
                               m.kv_lora_rank)  # fmt: skip
        return self.values(out, gate)

    def _index_query_and_key(
        self, x: torch.Tensor, bottleneck: torch.Tensor, key: torch.Tensor, step: Step
    ) -> torch.Tensor:
        """The indexer's queries [t, H, D], rotated; its keys, rotated, into ``key`` [t, D]."""
        ix, r, t = self.ix, self.mla.qk_rope_head_dim, x.shape[0]
        q = self.wq_b(bottleneck).view(t, ix.n_heads, ix.head_dim)
        norm = self.k_norm  # in the model's dtype (HY V4's in float32, as transformers)
        k = F.layer_norm(self.wk(x).to(norm[0].dtype), (ix.head_dim,), *norm, eps=ix.key_norm_eps)
        k = k.to(x.dtype)
        rot = slice(ix.head_dim - r, None) if ix.rope_last else slice(0, r)  # HY V4's: its last
        q_rot, k_rot = x.new_empty(t, ix.n_heads, r), x.new_empty(t, 1, r)
        _rotary_dims(q_rot, q[..., rot], ix.rope_interleave)
        _rotary_dims(k_rot, k[:, None, rot], ix.rope_interleave)
        positions, rows = step.rope[self.rope]
        self.ctx.ops.rotary_embedding(positions=positions, q=q_rot, k=k_rot, cos_sin_cache=rows)
        q[..., rot] = q_rot
        key.copy_(k)
        key[:, rot] = k_rot[:, 0]
        return q

    def _select(
        self, q: torch.Tensor, x: torch.Tensor, keys: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots [T, k], kept [T, k]): each token's ``index_topk`` best keys' cache slots
        (module docstring), and which of them are real (False: fewer keys than k)."""
        ix, plan = self.ix, index_plan(meta)
        b, qp = plan.q_rows.shape
        kp, h, d = plan.slots.shape[1], ix.n_heads, ix.head_dim
        k = min(ix.topk, kp)
        ctx_keys = keys[plan.slots].float().transpose(1, 2)  # [B, D, K]
        k_pos = torch.arange(kp, device=q.device)
        qb = q[plan.q_rows].float()  # [B, Q, H, D]
        weights = self.weights_proj(x.float()) * h**-0.5  # [T, H]
        wb = weights[plan.q_rows].unsqueeze(-2)  # [B, Q, 1, H]
        best = torch.empty(b, qp, k, dtype=torch.long, device=q.device)
        kept = torch.empty(b, qp, k, dtype=torch.bool, device=q.device)
        n = max(1, MAX_SCORE_ELEMS // (b * h * kp))
        for r0 in range(0, qp, n):  # row slices bound the [B, n, H, K] products
            r1 = min(r0 + n, qp)
            s = torch.matmul(qb[:, r0:r1].reshape(b, -1, d), ctx_keys)
            s = s.mul_(d**-0.5).relu_().view(b, r1 - r0, h, kp)
            scores = torch.matmul(wb[:, r0:r1], s).squeeze(-2)  # [B, n, K]
            scores.masked_fill_(k_pos > plan.q_pos[:, r0:r1], float("-inf"))  # causal
            top = scores.topk(k, dim=-1)
            best[:, r0:r1], kept[:, r0:r1] = top.indices, top.values > float("-inf")
        slots = plan.slots.gather(1, best.view(b, -1)).view(b * qp, k)
        return slots.index_select(0, plan.src), kept.view(b * qp, k).index_select(0, plan.src)


def sparse_attention(
    q: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    kept: torch.Tensor,
    scale: float,
    latent: int,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Absorbed attention of each token over its kept cache rows only: ``q`` [T, h, C] (C the
    row's scored columns), ``rows`` [slots, W] the cache, ``slots`` / ``kept`` [T, k] →
    [T, h, latent], the softmax in float32 (transformers' eager attention), in token slices;
    ``sinks`` (float32 [h], HY V4's): each head's learned logit in its softmax's denominator."""
    t, h, c = q.shape
    k = slots.shape[1]
    out = q.new_empty(t, h, latent)
    n = max(1, MAX_SCORE_ELEMS // (k * max(h, rows.shape[1])))
    for t0 in range(0, t, n):
        t1 = min(t0 + n, t)
        sel = rows[slots[t0:t1]]  # [n, k, W]
        s = torch.bmm(q[t0:t1], sel[..., :c].transpose(1, 2).to(q.dtype)).float() * scale
        s.masked_fill_(~kept[t0:t1, None, :], float("-inf"))
        if sinks is None:
            p = torch.softmax(s, dim=-1).to(q.dtype)
        else:
            p = _softmax_with_sinks(s, sinks.view(1, h, 1)).to(q.dtype)
        out[t0:t1] = torch.bmm(p, sel[..., :latent].to(q.dtype))
    return out


class DsaModel(DeepseekModel):
    """DeepSeek-V3.2 and GLM-5 (module docstring)."""

    layer_class = DsaLayer
