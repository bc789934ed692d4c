"""HY V4 (`HYV4ForCausalLM`, tencent/Hy4-preview): GLM-5's model (`dsa.py`: DeepSeek-V3's latent
attention with the lightning indexer, "shared" layers reusing the previous full layer's choice;
GLM-4.7-Flash's sigmoid-routed experts beside an ungated shared expert) with what transformers'
``modeling_hy_v4.py`` changes:

- **hyper-connections** (`hyper_connection.py`, HY V4's independent form): the residual is
  ``hc_mult`` streams per token; each layer's attention and MLP read a per-token mix of them
  (``attn_hc`` / ``ffn_hc``), their outputs join every stream scaled by ``post``; the last
  streams are folded by ``hc_head`` before the final norm;
- attention: each head's output gated by ``sigmoid(gate_proj(x))`` before o_proj, and a
  learned sink logit per head (``sinks``) in every softmax's denominator; the indexer's rotary
  on its *last* ``qk_rope_head_dim`` dims, its key's LayerNorm in float32 with
  ``rms_norm_eps`` (`IndexerConfig.rope_last`, ``key_norm_eps``);
- the routed experts' SwiGLU clamped: ``silu(min(gate, L)) * clamp(up, -L, L)``,
  ``L = swiglu_limit`` (the shared expert and the dense MLP are not; on CUDA the fused-MoE
  kernel's ``silu_limit`` activation); experts stacked (`hy_v4_config.py`).

**Every step attends sparsely** in torch (`dsa.sparse_attention`, with the sinks): the
backends' dense attention takes no sinks over a latent row, so the indexer runs in every step
and keeps every key while a sequence has no more than ``index_topk`` (as transformers' top-k
of ``min(index_topk, keys)`` does). The cache row is GLM-5's (latent, rotary key, indexer key),
so prefix caching, chunked prefill and preemption work as for GLM-5; the streams live only
within a step (nothing recurrent is cached).

transformers keeps the LM head in float32 (`_keep_in_fp32_modules_strict`): here it runs in the
model's dtype (the same in float32; in bf16 the logits round once more). Not supported (one
line each, `family_options`): ``--quantization fp8`` and FP8 checkpoints, FP8/int8 KV caches.

Tensor parallel (`distributed/layout.py`): the latent attention's heads as GLM-5's (`dsa.py`:
the indexer whole on every rank), each head's gate rows and sink with it; the stacked experts
and the shared expert by width (one all-reduce); the hyper-connections and ``hc_head``
replicated (small: a few [N, N * D] mixes a layer, every rank the same streams).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.dsa import KEPT, DsaLayer, DsaModel, sparse_attention
from pagoda.runtime.model.hy_v4_config import HC
from pagoda.runtime.model.hyper_connection import HyperConnection, HyperHead, expand
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step, linear_layer
from pagoda.runtime.model.moe import SharedExpertMoE, make_mlp
from pagoda.runtime.model.parallel_linear import column_linear


def silu_limit_and_mul(x: torch.Tensor, limit: float) -> torch.Tensor:
    """The routed experts' activation of ``x`` [n, 2I] (gate columns, then up), in float32,
    rounded once (as the fused kernel's ``silu_limit``): ``silu(min(gate, limit)) *
    clamp(up, -limit, limit)``."""
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)).to(x.dtype)


class HyV4Layer(DsaLayer):
    """GLM-5's layer between two hyper-connections, its attention gated with sinks."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        a, hc = prefix + "self_attn.", model.config.family.hyper
        gate, sinks = [a + "gate_proj.weight"], w.source(a + "sinks").float()
        if ctx.tp is None:
            self.gate = linear_layer(ctx, w, gate)
        else:  # this rank's heads' gates and sinks (a copy: not the whole's view)
            h0, h1 = ctx.tp.layout.heads(model.config.num_heads)
            v = self.mla.v_head_dim
            self.gate = column_linear(ctx, w, gate, [(h0 * v, h1 * v)])
            sinks = sinks[h0:h1].clone()
        self.sinks = sinks
        if self.k_norm is not None:  # float32, as transformers keeps it
            p = a + "indexer.k_norm."
            self.k_norm = (w.source(p + "weight").float(), w.source(p + "bias").float())
        self.attn_hc, self.ffn_hc = (
            HyperConnection(hc, *(w.source(f"{prefix}{block}.{n}") for n in HC))
            for block in ("attn_hc", "ffn_hc")
        )

    def linears(self):
        return [*super().linears(), self.gate]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, None]:
        """The next streams [T, N, D] from the streams ``h`` (`residual`: unused, None)."""
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        post, comb, x = self.attn_hc(h)
        y = self.attention(norm(x=x, weight=self.attn_norm, eps=eps), step)
        h = self.attn_hc.merge(h, post, comb, y)
        post, comb, x = self.ffn_hc(h)
        y = self.mlp(norm(x=x, weight=self.mlp_norm, eps=eps))
        return self.ffn_hc.merge(h, post, comb, y), None

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """Sparse latent attention with sinks (module docstring), each head's value gated."""
        m, meta = self.mla, step.meta
        cr = m.kv_lora_rank + m.qk_rope_head_dim
        q_full, k_full, bottleneck, _ = self.project(x, step, self.ix.head_dim)
        q_index = None
        if self.full:  # the indexer's key into the row's last columns
            q_index = self._index_query_and_key(x, bottleneck, k_full[:, 0, cr:], step)
        else:  # a shared layer's row has no indexer key: zeros
            k_full[:, 0, cr:] = 0
        k_cache = step.kv_caches[self.index][0]
        rows = k_cache.view(-1, k_cache.shape[-1])  # one KV head: [slots, W] in any layout
        rows.index_copy_(0, meta.slot_mapping, k_full[:, 0].to(rows.dtype))
        if self.full:
            meta.aux[KEPT] = self._select(q_index, x, rows[:, cr:], meta)
        slots, kept = meta.aux[KEPT]
        out = sparse_attention(q_full[..., :cr], rows, slots, kept, self.ctx.backend.scale,
                               m.kv_lora_rank, self.sinks)  # fmt: skip
        t, h = out.shape[:2]
        return self.values(out, self.gate(x).view(t, h, -1))  # (sigmoid(gate) in float32)


class HyV4Model(DsaModel):
    """HY V4 (module docstring)."""

    layer_class = HyV4Layer
    moe_names = ("mlp.", ("gate_up_proj", "down_proj"))  # stacked (hy_v4_config.py)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        hc = self.config.family.hyper
        self.hc_head = HyperHead(hc, *(w.source(f"model.hc_head.hc_{n}") for n in HC))

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        mlp = make_mlp(self, w, prefix, index, ctx)
        limit = self.config.family.swiglu_limit
        if isinstance(mlp, SharedExpertMoE) and limit is not None:  # the routed experts'
            mlp.routed.act_and_mul = lambda x: silu_limit_and_mul(x, limit)
            mlp.routed.fused_activation = dict(activation="silu_limit", limit=limit)
        return mlp

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The first streams: each token's embedding in every one [T, N, D]."""
        return expand(self.embed_tokens(input_ids), self.config.family.hyper.mult)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The last streams folded (`HyperHead`), then the final norm."""
        x = self.hc_head(h)
        return self.rms_norm(x=x, weight=self.norm, eps=self.config.rms_norm_eps)
