"""MiniMax-M3's text model (`MiniMaxM3VLForCausalLM`; config read in `minimax_m3_config.py`), as
transformers' `modeling_minimax_m3_vl.py` computes it: MiniMax-M2's model (`minimax_m2.py`:
sigmoid router with a choice-only correction bias, renormalised) with

- Gemma's RMSNorm (1 + w, scaled in float32, rounded once) everywhere, and per-head q/k norms
  before rotary (Qwen3's layer) in place of M2's whole-projection ones;
- gpt-oss's clamped SwiGLU (`gpt_oss.swiglu_oai`: (clamp(up) + 1) * g * sigmoid(alpha * g),
  g = min(gate, limit)) in every MLP: the dense layers' (`mlp_layer_types`), the routed experts'
  (stacked `experts.gate_up_proj` [E, 2I, hidden] gate rows then up, `experts.down_proj`; the
  fused-MoE kernel's `swiglu_oai` on CUDA) and the ungated shared expert's, each MLP's gate and
  up stored as one `gate_up_proj`;
- the routed experts' sum x `routed_scaling_factor`, then + the shared expert;
- the `minimax_m3_sparse` layers' lightning indexer (`BlockIndexer`, transformers'
  `MiniMaxM3VLIndexer`): ``index_n_heads`` queries (one per KV head) and one key per token,
  ``q_proj`` / ``k_proj`` Gemma-normed and rotated as the layer's, the key cached per KV-cache
  slot in the layer's key table (`side_tables.SlotTable`, counted in the KV budget: prefix
  hits, chunked prefill and preemption read the keys of the blocks they read); a query's
  float32 score for key j ``q_h . k_j`` (unscaled), its max over each block of
  ``index_block_size`` keys at or before the query (every key scored each step: a max does
  not pool ahead), the
  ``index_local_blocks`` blocks ending at its own forced in, its ``index_topk_blocks`` best
  blocks per KV head kept. While no sequence of the step is longer than ``index_topk_blocks``
  x ``index_block_size`` every earlier key is kept and the backend attends; past it each KV
  head's queries attend to their kept keys only, batched over the step in torch
  (`dsa.index_plan`; the K/V rows read through `AttentionBackend.read_kv`).

Tensor parallel as Qwen3's heads and MiniMax-M2's experts: each fused `gate_up_proj` by
rows of each half (`parallel_linear.fused_gate_up`), the shared expert's partial sum joining
the experts' before their one all-reduce; a sparse layer's indexer by KV heads (a rank's
queries of its KV heads, the one key per token whole, its key table beside its cache).
FP8, an FP8 checkpoint and FP8/int8 KV caches are refused (`family_options`); CUDA graphs capture decodes within the indexer's dense reach and replay
there only (`ModelRunner.graph_seq_limit`).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.dsa import MAX_SCORE_ELEMS, index_plan
from pagoda.runtime.model.gpt_oss import swiglu_oai
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaModel, Step, linear_layer
from pagoda.runtime.model.moe import SharedExpertMoE, SparseMoE
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.parallel_linear import column_linear, fused_gate_up, row_linear
from pagoda.runtime.model.qwen3 import Qwen3Layer, Qwen3Model
from pagoda.runtime.model.side_tables import SlotTable


class FusedGateUpMLP(GatedMLP):
    """down(act(gate_up(x))), gate and up stored as one `gate_up_proj` (gate rows first); on a
    tensor-parallel rank its rows of each half, down row-parallel (`partial`: its columns
    alone, the sum left to the caller: a shared expert's joins the experts')."""

    def __init__(
        self, ctx: LayerContext, w: DeviceWeights, prefix: str, partial: bool = False
    ) -> None:
        self.gate_up = fused_gate_up(ctx, w, prefix + "gate_up_proj.weight")
        down = prefix + "down_proj.weight"
        self.down = linear_layer(ctx, w, [down]) if ctx.tp is None else row_linear(ctx, w, down)
        if partial and ctx.tp is not None:
            self.down = self.down.inner  # (no bias)
        self.act_and_mul = ctx.act_and_mul


class BlockIndexer:
    """One sparse layer's lightning indexer (module docstring)."""

    def __init__(self, model: LlamaModel, ctx: LayerContext, w: DeviceWeights, p: str, ix):
        self.ix, self.ctx, self.heads = ix, ctx, ctx.num_kv_heads  # (one query per KV head)
        names = [p + "q_proj.weight", p + "k_proj.weight"]
        if ctx.tp is None:
            self.proj = linear_layer(ctx, w, names)
        else:  # its KV heads' queries, the one key whole
            k0, k1 = ctx.tp.layout.kv_heads(ix.n_heads)
            rows = [(k0 * ix.head_dim, k1 * ix.head_dim), (0, ix.head_dim)]
            self.proj = column_linear(ctx, w, names, rows)
        self.q_norm = model.norm_weight(w[p + "q_norm.weight"])
        self.k_norm = model.norm_weight(w[p + "k_norm.weight"])
        self.keys = SlotTable(ix.head_dim)  # each cached token's key (`side_tables`)

    def query_and_store(self, x: torch.Tensor, step: Step, rope: str, cache: torch.Tensor):
        """The normed, rotated queries [T, H, D]; the keys stored at the step's slots of the
        key table that goes with the layer's KV ``cache`` (a new cache gets a new table)."""
        ix, ctx, t = self.ix, self.ctx, x.shape[0]
        d, norm = ix.head_dim, ctx.rms_norm
        q, k = self.proj(x).split([self.heads * d, d], dim=-1)
        q = norm(x=q.reshape(-1, d), weight=self.q_norm, eps=ctx.eps).view(t, self.heads, d)
        k = norm(x=k.contiguous(), weight=self.k_norm, eps=ctx.eps).view(t, 1, d)
        positions, rows = step.rope[rope]
        r = rows.shape[-1]  # (a partial rotary's first dims, in place)
        ctx.ops.rotary_embedding(positions=positions, q=q[..., :r], k=k[..., :r],
                                 cos_sin_cache=rows)  # fmt: skip
        slots = cache.numel() // (ctx.num_kv_heads * ctx.head_dim)
        self.keys.bind(cache, slots, x.dtype)
        self.keys.write(step.meta.slot_mapping, k[:, 0])
        return q

    def select(self, q: torch.Tensor, meta: AttentionMetadata):
        """(slots [T, Hkv, W], kept [T, Hkv, W]), W = topk x block: each KV head's kept
        cache slots of each token and which are real (module docstring)."""
        ix, plan = self.ix, index_plan(meta)
        b, qp = plan.q_rows.shape
        kp, h, size, dev = plan.slots.shape[1], self.heads, ix.block, q.device
        nb = -(-kp // size)
        k = min(ix.topk, nb)
        keys = self.keys.rows[plan.slots].float()  # [B, K, D]
        keys = torch.nn.functional.pad(keys, (0, 0, 0, nb * size - kp)).transpose(1, 2)
        qb = q[plan.q_rows].float()  # [B, Q, H, D]
        pos = torch.arange(nb * size, device=dev)
        best = torch.empty(b, qp, h, k, dtype=torch.long, device=dev)
        real = torch.empty(b, qp, h, k, dtype=torch.bool, device=dev)
        n = max(1, MAX_SCORE_ELEMS // (b * h * nb * size))
        for r0 in range(0, qp, n):  # row slices bound the [B, n, H, K] scores
            r1 = min(r0 + n, qp)
            s = torch.matmul(qb[:, r0:r1].reshape(b, -1, ix.head_dim), keys)
            s = s.view(b, r1 - r0, h, -1)
            last = plan.q_pos[:, r0:r1, :, None]  # [B, n, 1, 1]
            s.masked_fill_(pos > last, float("-inf"))  # (the padding too: past every query)
            blocks = s.view(b, r1 - r0, h, nb, size).amax(-1)  # [B, n, H, NB]
            own = torch.div(last, size, rounding_mode="floor")
            local = (own - torch.arange(ix.local, device=dev)).clamp(min=0)  # [B, n, 1, L]
            blocks.scatter_(-1, local.expand(-1, -1, h, -1), float("inf"))
            top = blocks.topk(k, dim=-1)
            best[:, r0:r1], real[:, r0:r1] = top.indices, top.values > float("-inf")
        tok = (best[..., None] * size + torch.arange(size, device=dev)).flatten(-2)  # [B,Q,H,W]
        kept = (real[..., None].expand(-1, -1, -1, -1, size).flatten(-2)
                & (tok <= plan.q_pos[..., None]))  # fmt: skip
        tok = tok.clamp(max=kp - 1)
        slots = plan.slots.gather(1, tok.view(b, -1)).view(b * qp, h, -1)
        return slots[plan.src], kept.view(b * qp, h, -1)[plan.src]


def block_sparse(q, backend, k_cache, v_cache, slots, kept, scale: float) -> torch.Tensor:
    """Each token's heads ``q`` [T, H, D] over their KV head's kept cache slots only
    (``slots`` / ``kept`` [T, Hkv, W]) → [T, H, D], in token slices, the softmax in float32."""
    t, h, d = q.shape
    hkv, w = slots.shape[1:]
    out = q.new_empty(t, h, d)
    heads = torch.arange(hkv, device=q.device)
    n = max(1, MAX_SCORE_ELEMS // (w * h * hkv))
    for t0 in range(0, t, n):
        t1 = min(t0 + n, t)
        keys, values = backend.read_kv(k_cache, v_cache, slots[t0:t1])  # [n, Hkv, W, Hkv, D]
        keys = keys[:, heads, :, heads].transpose(0, 1).to(q.dtype)  # [n, Hkv, W, D]: its own
        values = values[:, heads, :, heads].transpose(0, 1).to(q.dtype)
        qs = q[t0:t1].view(t1 - t0, hkv, h // hkv, d)
        s = torch.einsum("nhgd,nhwd->nhgw", qs, keys).float() * scale
        s.masked_fill_(~kept[t0:t1, :, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype)
        out[t0:t1] = torch.einsum("nhgw,nhwd->nhgd", p, values).reshape(t1 - t0, h, d)
    return out


class MiniMaxM3Layer(Qwen3Layer):
    """Qwen3's layer (Gemma norms); a sparse layer's indexer and block-sparse attention."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        ix = model.config.family.block_index
        self.indexer = None
        if ix is not None and ix.layers[index]:
            self.indexer = BlockIndexer(model, ctx, w, prefix + "self_attn.indexer.", ix)
            self.side_tables = [self.indexer.keys]

    def linears(self):
        return [*super().linears(), *([self.indexer.proj] if self.indexer else [])]

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        if self.indexer is None:
            return super().attention(x, step)
        ctx, meta = self.ctx, step.meta
        t, d = x.shape[0], ctx.head_dim
        k_cache, v_cache = step.kv_caches[self.index]
        q_index = self.indexer.query_and_store(x, step, self.rope, k_cache)
        if meta.max_seq_len <= self.indexer.ix.dense_reach:  # every earlier key kept
            return super().attention(x, step)
        q, k, v = self.rotated_qkv(x, step)
        ctx.backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        slots, kept = self.indexer.select(q_index, meta)
        out = block_sparse(q, ctx.backend, k_cache, v_cache, slots, kept, ctx.backend.scale)
        return self.o_proj(out.reshape(t, ctx.num_heads * d))


class MiniMaxM3Model(Qwen3Model):
    layer_class = MiniMaxM3Layer
    rms_norm_16bit = staticmethod(gemma_rms_norm)
    moe_names = ("mlp.", ("gate_up_proj", "down_proj"))
    moe_suffix = ""  # (experts.gate_up_proj, experts.down_proj: stacked, no `.weight`)

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """1 + w in float32, as Gemma's norm computes it (the model's dtype for float32)."""
        one_plus = 1.0 + weight.float()
        return one_plus if self.dtype != torch.float32 else one_plus.to(self.dtype)

    def layer_context(self, linear) -> LayerContext:
        f = self.config.family
        act = functools.partial(_swiglu_oai, alpha=f.swiglu_alpha, limit=f.swiglu_limit)
        return dataclasses.replace(super().layer_context(linear), act_and_mul=act)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        f = self.config.family
        if not f.has_experts(index):
            return FusedGateUpMLP(ctx, w, prefix + "mlp.")
        routed = SparseMoE.from_weights(self, w, prefix, ctx)
        routed.fused_activation = dict(
            activation="swiglu_oai", alpha=f.swiglu_alpha, limit=f.swiglu_limit
        )
        shared = FusedGateUpMLP(ctx, w, prefix + "mlp.shared_experts.", partial=True)
        return SharedExpertMoE(routed, shared, None)  # (one all-reduce for both)


def _swiglu_oai(*, x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """`gpt_oss.swiglu_oai` as the layers' `act_and_mul` (keyword `x`)."""
    return swiglu_oai(x, alpha, limit)
