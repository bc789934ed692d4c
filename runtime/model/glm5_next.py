"""GLM-5-Next (`Glm5NextForConditionalGeneration`, GLM-5.3-Flash: its text model, read text-only
from ``model.language_model.``; config read in `glm5_next_config.py`): Kimi Linear's hybrid
(`kimi_linear.py`: KDA layers among NoPE latent attention layers, DeepSeek-V3's router and
experts) with what transformers' ``modeling_glm5_next.py`` changes:

- **the indexed layers** (``indexed_attention``): GLM-5's DeepSeek Sparse Attention
  (`dsa.py`) with no rotary at all (``qk_rope_head_dim`` 0, the softmax scale
  qk_nope_head_dim ** -0.5), its q bottleneck's and latent's norms at ``rms_norm_eps``, and a
  **k-pool indexer** (`Glm5NextLayer._select_pools`): a token's indexer key
  ``LayerNorm(wk(x))`` and gate score ``index_kpool_compress_gate(x)`` are cached in its row
  (``[latent | key | gate]``, `MlaConfig.cache_width`); a sequence's positions are cut into
  pools of ``index_kpool`` from its first token, each pool's key the per-channel softmax (over
  the pool, of gate + ``index_kpool_compress_ape`` by position) mix of its tokens' keys; a
  query scores the whole pools that end at or before it (``sum_h w_h relu(q_h . key /
  sqrt(D))``, ``w = weights_proj(x) / sqrt(H)``, in the model's dtype as transformers keeps
  it; a pool's key mixed once, by the step whose token ends it, into the layer's pool table:
  `side_tables.PoolTable`) and attends to the tokens of its ``index_topk / index_kpool`` best and to those of its
  own unfinished pool. While no sequence of the step is longer than ``index_topk +
  index_kpool - 1`` that is every earlier token: the step attends densely through the
  backend (the rows still written). "Shared" layers reuse the previous full layer's choice;
- the latent attention of a step is dense or sparse as its longest sequence says (as
  GLM-5's): a sequence's bits may differ with the batch it is in (the same tokens are kept),
  and pools whose scores tie exactly may be kept in another order than transformers' picks;
- **KDA with GLM's gates** (`Glm5NextDeltaAttention`): Kimi's low-rank forget gate
  (``forget_gate.f_a_proj`` / ``f_b_proj``, its ``A_log`` [H] and ``dt_bias`` [H K]) bounded as
  BailingHybrid's, ``g = linear_lower_bound * sigmoid(exp(A_log) (f + dt_bias))`` (float32; the
  unbounded gate of a null bound is refused), Kimi's low-rank output gate, the conv in
  float32 and its SiLU output rounded to the model's dtype (transformers keeps the conv so);
- **mHC hyper-connections** (`hyper_connection.py`, DeepSeek-V4's manifold-constrained form:
  ``pre``, ``post``, Sinkhorn-projected ``comb``) around every attention, KDA and MLP block,
  the residual ``hc_mult`` streams per token; the last streams folded by their plain mean (not
  DeepSeek-V4's weighted head) before the final norm;
- **every SwiGLU clamped**: ``silu(min(gate, L)) * clamp(up, -L, L)``, ``L = swiglu_limit``,
  in the dense MLPs, the shared expert and the routed experts (on CUDA the fused-MoE kernel's
  ``silu_limit``), in the model's dtype as transformers computes it.

The KDA states live in the hybrids' state slots (prefix caching, chunked prefill, preemption
and the tensor-parallel split as Kimi Linear's; the k-pool indexer, its pools' choice and the
streams whole on every rank, each rank picking the same pools); the streams live only within a
step. Not supported (one line each, `family_options`): ``--quantization fp8``, FP8
checkpoints, FP8/int8 KV caches (the indexer's rows are in the model's dtype), float16; CUDA
graphs are off (the step's path is chosen on the host, as GLM-5's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.bailing_hybrid import BailingDeltaAttention
from pagoda.runtime.model.deepseek import DeepseekModel
from pagoda.runtime.model.delta_rule_config import conv_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.dsa import KEPT, MAX_SCORE_ELEMS, DsaLayer, index_plan, sparse_attention
from pagoda.runtime.model.glm5_next_config import HC
from pagoda.runtime.model.hyper_connection import HyperConnection, expand
from pagoda.runtime.model.kimi_linear import KdaShard, KimiLinearLayer
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import MAMBA_STEP
from pagoda.runtime.model.moe import SharedExpertMoE, make_mlp
from pagoda.runtime.model.side_tables import PoolTable
from pagoda.runtime.recurrent_configs import MambaConfig


class Glm5NextDeltaAttention(BailingDeltaAttention):
    """One KDA layer (module docstring): Kimi's low-rank gates, BailingHybrid's bound and
    float32 conv."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, eps, ctx,
                 lower_bound: float):  # fmt: skip
        p = prefix + "self_attn."
        g = p + "forget_gate."
        r = KdaShard(m, w, ctx)
        self.m, self.index, self.eps, self.beta_scale = r.local, index, eps, 1.0
        dev, self.lower_bound, self.dtype = w.device, lower_bound, w.dtype
        # x's projections in one matmul: q k v (the conv's channels), f_a, g_a (whole), b
        rows = ((p + "q_proj", r.qk), (p + "k_proj", r.qk), (p + "v_proj", r.v),
                (g + "f_a_proj", None), (p + "g_a_proj", None), (p + "b_proj", r.heads))  # fmt: skip
        self.in_proj = ctx.linear(torch.cat([r.rows(n + ".weight", s) for n, s in rows]))
        self.f_b = ctx.linear(r.rows(g + "f_b_proj.weight", r.qk))
        self.g_b = ctx.linear(r.rows(p + "g_b_proj.weight", r.v))
        self.out_proj = r.out_proj(p + "o_proj.weight")
        self.conv_weight = r.conv(
            torch.cat([w.source(n).float().to(dev) for n in conv_names(p, w)])
        )  # float32 (`_conv32`)
        self.conv_fn = self._conv32
        self.rate = torch.exp(r.per_head(w.source(g + "A_log").float().reshape(-1, 1))).to(dev)
        dt_bias = w.source(g + "dt_bias").float().view(m.n_heads, m.head_dim)
        self.dt_bias = r.per_head(dt_bias).to(dev)  # [H, K]
        self.norm = w.source(p + "o_norm.weight").float().to(dev)
        self.scale = m.d_state**-0.5
        self.sizes = [self.m.conv_dim, m.head_dim, m.head_dim, self.m.n_heads]

    def linears(self) -> list:
        return [self.in_proj, self.f_b, self.g_b, self.out_proj]

    def inputs(self, h: torch.Tensor):
        t, m = h.shape[0], self.m
        qkv, fa, ga, b = self.in_proj(h).split(self.sizes, dim=-1)
        beta = torch.sigmoid(b).float()
        f = self.f_b(fa).float().view(t, m.n_heads, m.head_dim) + self.dt_bias
        g = self.lower_bound * torch.sigmoid(self.rate * f)
        return qkv, self.g_b(ga), g, beta


class Glm5NextLayer(KimiLinearLayer, DsaLayer):
    """Kimi Linear's layer (KDA, or NoPE latent attention: here GLM-5's sparse attention with
    the k-pool indexer) between two mHC hyper-connections (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        hc = model.config.family.hyper
        self.attn_hc, self.ffn_hc = (
            HyperConnection(hc, *(w.source(f"{prefix}{block}.{n}").to(w.device) for n in HC))
            for block in ("attn_hc", "ffn_hc")
        )
        if self.mixer is not None:
            return
        self.dense_limit = self.ix.topk + self.ix.kpool - 1  # (module docstring)
        if self.full:  # weights_proj in the model's dtype (transformers keeps no float32 one)
            p = prefix + "self_attn.indexer."
            self.weights_proj = linear_layer(ctx, w, [p + "weights_proj.weight"])
            self.ape = w[p + "index_kpool_compress_ape"]  # [P, D]: a position's logit in a pool
            self.compress_gate = linear_layer(ctx, w, [p + "index_kpool_compress_gate"])
            self.pools = PoolTable(self.ix.kpool, self.ix.head_dim)  # each finished pool's key
            self.side_tables = [self.pools]

    def linears(self):
        if self.mixer is not None or not self.full:
            return super().linears()
        return [*super().linears(), self.weights_proj, self.compress_gate]

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> Glm5NextDeltaAttention:
        c = model.config
        bound = c.family.kda_lower_bound
        return Glm5NextDeltaAttention(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx, bound)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, None]:
        """The next streams [T, N, D] from the streams ``h`` (`residual`: unused, None)."""
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        post, comb, x = self.attn_hc(h)
        x = norm(x=x, weight=self.attn_norm, eps=eps)
        if self.mixer is not None:
            y = self.mixer(x, step.meta.aux[MAMBA_STEP])
        else:
            y = self.attention(x, step)
        h = self.attn_hc.merge(h, post, comb, y)
        post, comb, x = self.ffn_hc(h)
        y = self.mlp(norm(x=x, weight=self.mlp_norm, eps=eps))
        return self.ffn_hc.merge(h, post, comb, y), None

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """NoPE latent attention over every earlier token while the step's sequences are within
        the indexer's dense reach (the backend's), else over each token's kept pools (module
        docstring); the cache row ``[latent | indexer key | gate score]``."""
        m, ix, meta = self.mla, self.ix, step.meta
        c = m.kv_lora_rank
        q_full, k_full, bottleneck, _ = self.project(x, step, 2 * ix.head_dim)
        q_index = None
        if self.full:  # the indexer's key and gate score into the row's last columns
            q_index = self._pool_query_and_key(x, bottleneck, k_full[:, 0, c:])
        else:  # a shared layer's row has none: zeros (0 x garbage may be NaN)
            k_full[:, 0, c:] = 0
        k_cache, v_cache = step.kv_caches[self.index]
        rows = k_cache.view(-1, k_cache.shape[-1])  # one KV head: [slots, W] in any layout
        if meta.max_seq_len <= self.dense_limit:  # every earlier token kept
            out = self.ctx.backend.forward(
                q_full, k_full, k_full, k_cache, v_cache, meta, window=None,
                kv_scales=self.kv_scales,
            )  # fmt: skip
            if self.full:
                self._close_pools(rows[:, c:], meta)
            return self.values(out)
        rows.index_copy_(0, meta.slot_mapping, k_full[:, 0].to(rows.dtype))
        if self.full:
            self._close_pools(rows[:, c:], meta)
            meta.aux[KEPT] = self._select_pools(q_index, x, meta)
        slots, kept = meta.aux[KEPT]
        out = sparse_attention(q_full[..., :c], rows, slots, kept, self.ctx.backend.scale, c)
        return self.values(out)

    def _pool_query_and_key(
        self, x: torch.Tensor, bottleneck: torch.Tensor, row: torch.Tensor
    ) -> torch.Tensor:
        """The indexer's queries [t, H, D]; its key LayerNorm(wk(x)) and gate score
        compress_gate(x) into ``row`` [t, 2 D] (no rotary)."""
        ix, t = self.ix, x.shape[0]
        q = self.wq_b(bottleneck).view(t, ix.n_heads, ix.head_dim)
        k = F.layer_norm(self.wk(x), (ix.head_dim,), *self.k_norm, eps=ix.key_norm_eps)
        row[:, : ix.head_dim] = k
        row[:, ix.head_dim :] = self.compress_gate(x)
        return q

    def _close_pools(self, cached: torch.Tensor, meta: AttentionMetadata) -> None:
        """The keys of the pools the step's tokens end into the layer's pool table
        (`side_tables.PoolTable`), from ``cached`` [slots, 2 D]: each cached token's indexer
        key and gate score. Pool j of a sequence, its positions [j P, (j + 1) P): the sum over
        its tokens of softmax_over_the_pool(gate + ape[i]) * key (per channel, the softmax in
        float32, the mix in the cache's dtype, as transformers)."""
        d = self.ix.head_dim

        def pool_keys(slots: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
            rows = cached[slots]  # [N, P, 2 D]
            keys, gates = rows[..., :d], rows[..., d:]
            mix = torch.softmax(gates.float() + self.ape.float(), dim=1).to(keys.dtype)
            return (mix * keys).sum(dim=1)

        self.pools.bind(cached, cached.shape[0], cached.dtype, meta.block_size)
        self.pools.close(meta, pool_keys)

    def _select_pools(
        self, q: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots [T, k], kept [T, k]): each token's kept cache slots, k = index_topk +
        index_kpool - 1 (its best whole pools' tokens, then its unfinished pool's), and which
        are real. A query at position p scores the pools that end at or before p (their keys
        from the pool table, `_close_pools`): ``sum_h w_h relu(q_h . key_j / sqrt(D))``, keeps
        its ``index_topk / P`` best and the positions [floor((p + 1) / P) P, p]."""
        ix, plan = self.ix, index_plan(meta)
        b, qp = plan.q_rows.shape
        h, d, p = ix.n_heads, ix.head_dim, ix.kpool
        n = plan.slots.shape[1] // p  # whole pools in the longest context
        pool_keys = self.pools.gather(plan.slots, n).float().transpose(1, 2)  # [B, D, n]
        qb = q[plan.q_rows].float()  # [B, Q, H, D]
        wb = (self.weights_proj(x).float() * h**-0.5)[plan.q_rows].unsqueeze(-2)  # [B, Q, 1, H]
        ends = torch.arange(n, device=q.device) * p + p - 1  # each pool's last position
        k = min(ix.topk // p, n)
        best = torch.empty(b, qp, k, dtype=torch.long, device=q.device)
        kept = torch.empty(b, qp, k, dtype=torch.bool, device=q.device)
        step = max(1, MAX_SCORE_ELEMS // (b * h * n))
        for r0 in range(0, qp, step):  # row slices bound the [B, n, H, pools] products
            r1 = min(r0 + step, qp)
            s = torch.matmul(qb[:, r0:r1].reshape(b, -1, d), pool_keys)
            s = s.mul_(d**-0.5).relu_().view(b, r1 - r0, h, n)
            scores = torch.matmul(wb[:, r0:r1], s).squeeze(-2)  # [B, rows, n]
            scores.masked_fill_(ends > plan.q_pos[:, r0:r1], float("-inf"))  # unfinished, later
            top = scores.topk(k, dim=-1)
            best[:, r0:r1], kept[:, r0:r1] = top.indices, top.values > float("-inf")
        offsets = torch.arange(p, device=q.device)
        pos = (best[..., None] * p + offsets).flatten(-2)  # [B, Q, k P]
        kept = kept[..., None].expand(b, qp, k, p).flatten(-2)
        tail = torch.div(plan.q_pos + 1, p, rounding_mode="floor") * p + offsets[:-1]
        pos = torch.cat([pos, tail], dim=-1)
        kept = torch.cat([kept, tail <= plan.q_pos], dim=-1)
        pos = pos.clamp_(max=plan.slots.shape[1] - 1).view(b, -1)
        slots = plan.slots.gather(1, pos).view(b * qp, -1)
        return slots.index_select(0, plan.src), kept.view(b * qp, -1).index_select(0, plan.src)


class Glm5NextModel(DeepseekModel):
    """GLM-5-Next's text model (module docstring): no rotary tables."""

    layer_class = Glm5NextLayer

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        return {}

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        """The dense MLP, or the routed and shared experts, each SwiGLU clamped."""
        mlp = make_mlp(self, w, prefix, index, ctx)
        limit = self.config.family.swiglu_limit
        if limit is None:
            return mlp

        def act(x: torch.Tensor) -> torch.Tensor:  # in the model's dtype, as transformers
            gate, up = x.chunk(2, dim=-1)
            return F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)

        if isinstance(mlp, SharedExpertMoE):
            mlp.routed.act_and_mul = act
            mlp.routed.fused_activation = dict(activation="silu_limit", limit=limit)
            mlp.shared.act_and_mul = act
        else:
            mlp.act_and_mul = act
        return mlp

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first streams: each token's embedding in every one [T, N, D]."""
        return expand(self.embed_tokens(input_ids), self.config.family.hyper.mult)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The last streams' mean, then the final norm."""
        return self.rms_norm(x=h.mean(dim=1), weight=self.norm, eps=self.config.rms_norm_eps)
