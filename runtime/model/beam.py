"""Beam (`BeamForCausalLM`: Reflection AI's Beam), as transformers' modular_beam.py runs it:

- Qwen3-MoE's attention (per-head q/k RMSNorms before rotary) with a window on the
  `sliding_attention` layers, which rotate (`rope_parameters.sliding_attention`); the
  `full_attention` layers (every sixth and the last, by default) attend without positions, their
  q scaled by ``(1 + (position + 1) / 2048) ** 0.1`` in float32 (a table beside the rotary's,
  gathered with it, as Llama 4's temperature tuning);
- attention's output gated per head element, ``out * sigmoid(gate_proj(x) + gate_bias[head])``
  before o_proj (`self_attn.gate_proj`, `self_attn.gate_bias`: split by heads under tensor
  parallelism, as q);
- four norms a layer (after attention, before and after the MLP; OLMo 3's RMSNorm, scaled in
  float32 and rounded once) and **depth-scaled residual adds**: the k-th add of the model
  (attention's of layer i is ``2(i + 1)``, its MLP's the next) gives ``branch / sqrt(k) +
  stream * sqrt((k - 1) / k)``, so the stream is carried whole from layer to layer (no fused
  add-and-norm);
- dense SwiGLU MLPs (by default the first three layers) or DeepSeek-V3's router (sigmoid
  scores plus the correction bias for the choice, the best `topk_group` of `n_group` groups,
  renormalised, times `routed_scaling_factor`: `moe_routing.GroupedRouter`) over DeepSeek-V4's
  experts without their clamp (plain SwiGLU), no shared expert;
- the logits soft-capped, ``30 tanh(logits / 30)`` (`final_logit_softcapping`).

transformers evaluates the MLPs' SwiGLU product in float32 and rounds once; this engine's
`silu_and_mul` rounds in the model's dtype (the same in float32, within rounding in 16 bits).
"""

from __future__ import annotations

import math

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step, linear_layer
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.parallel_linear import column_linear
from pagoda.runtime.model.qwen3 import Qwen3Layer

NOPE_SCALE = "nope_scale"  # the rope table of the full-attention layers' q scales


class BeamLayer(Qwen3Layer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        c, a = model.config, prefix + "self_attn."
        self.pre_ff_norm = model.norm_weight(w[prefix + "pre_feedforward_layernorm.weight"])
        self.post_ff_norm = model.norm_weight(w[prefix + "post_feedforward_layernorm.weight"])
        bias = w[a + "gate_bias"]
        if ctx.tp is None:
            self.gate = linear_layer(ctx, w, [a + "gate_proj.weight"])
        else:  # this rank's heads' rows, as q's
            q0, q1 = ctx.tp.layout.heads(c.num_heads)
            self.gate = column_linear(ctx, w, [a + "gate_proj.weight"],
                                      [(q0 * c.head_dim, q1 * c.head_dim)])  # fmt: skip
            bias = bias[q0:q1]
        self.gate_bias = bias.reshape(1, -1, 1).contiguous()  # [1, heads, 1]
        k = 2 * (index + 1)  # this layer's two residual adds: k, k + 1
        self.adds = [(1 / math.sqrt(n), math.sqrt((n - 1) / n)) for n in (k, k + 1)]

    def linears(self):
        return [*super().linears(), self.gate]

    def __call__(self, h: torch.Tensor, residual: None, step: Step) -> tuple[torch.Tensor, None]:
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        (a1, s1), (a2, s2) = self.adds
        out = self.attention(norm(x=h, weight=self.attn_norm, eps=eps), step)
        h = norm(x=out, weight=self.mlp_norm, eps=eps) * a1 + h * s1  # post_attention_layernorm
        out = self.mlp(norm(x=h, weight=self.pre_ff_norm, eps=eps))
        return norm(x=out, weight=self.post_ff_norm, eps=eps) * a2 + h * s2, None

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3-MoE's q/k norms (Llama's RMSNorm: rounded, then scaled), then the
        full-attention layers' q scale by position."""
        norm, eps = self.ctx.ops.rms_norm, self.ctx.eps
        q = norm(x=q.reshape(-1, q.shape[-1]), weight=self.q_norm, eps=eps).view(q.shape)
        k = norm(x=k.reshape(-1, k.shape[-1]), weight=self.k_norm, eps=eps).view(k.shape)
        return q, k

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """The sliding layers: Llama's (rotary, the window). The full-attention layers: no
        rotary, q scaled by position in float32 (module docstring)."""
        if self.rope is not None:
            return super().attention(x, step)
        ctx = self.ctx
        t, d = x.shape[0], ctx.head_dim
        q, k, v = self.qkv_heads(x)
        q, k = self.before_rotary(q, k)
        positions, rows = step.rope[NOPE_SCALE]
        scale = rows if positions is None else rows.index_select(0, positions)
        q = (q.float() * scale.float().unsqueeze(1)).to(q.dtype)  # [T, 1, 1]
        k_cache, v_cache = step.kv_caches[self.index]
        out = ctx.backend.forward(q, k, v, k_cache, v_cache, step.meta, window=self.window,
                                  kv_scales=self.kv_scales)  # fmt: skip
        return self.o_proj(self.attention_output(x, out.reshape(t, ctx.num_heads * d)))

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        t, h = out.shape[0], self.gate_bias.shape[1]
        gate = self.gate(x).view(t, h, -1) + self.gate_bias
        return (out.view(t, h, -1) * torch.sigmoid(gate)).view(t, -1)


class BeamModel(LlamaModel):
    layer_class = BeamLayer
    rms_norm_16bit = staticmethod(gemma_rms_norm)  # OLMo 3's: float32 scaling, rounded once
    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        caches = super().build_rope_caches(max_positions)
        f = self.config.family
        if not all(map(f.has_rope, range(self.config.num_layers))):
            p = torch.arange(max_positions, dtype=torch.float32)
            scale = torch.exp(0.1 * torch.log1p((p + 1) / 2048))  # transformers' formula
            caches[NOPE_SCALE] = scale.unsqueeze(-1).to(self.device)
        return caches

    def logits(self, x, head):
        cap = self.config.family.final_logit_softcapping
        if not cap:
            return super().logits(x, head)
        return torch.tanh(self.lm_head(x).float() / cap) * cap  # in float32, as transformers

    def final_hidden(self, h: torch.Tensor, residual: None) -> torch.Tensor:
        return self.rms_norm(x=h, weight=self.norm, eps=self.config.rms_norm_eps)
