"""OLMo 2 and OLMoE: q and k each RMS-normalised over the whole projection (every head
together, weights [H * D] and [Hkv * D]) before they are split into heads and rotated
(`WholeQKNormLayer`).

OLMo 2 (`Olmo2Layer`) also moves the layer's norms after its sublayers:

- no norm on a sublayer's input: ``h = h + norm(attention(h))``, then ``h = h + norm(mlp(h))``
  (post_attention_layernorm, post_feedforward_layernorm), the final norm as Llama's;
- RMSNorm scales in float32 before rounding once (`ops.gemma_rms_norm` with the weight as
  stored; for a float32 model the same as `ops.rms_norm`).

OLMo 3 (`Olmo3ForCausalLM`, and llama.cpp's `olmo2` GGUF with a window) is OLMo 2's model with
sliding-window layers (`FamilyConfig.window_layers`: three of every four by default); the window
layers rotate with the plain base and the global ones with the configured scaling
(`rope_parameters` by layer kind: the "local" table, `FamilyConfig.local_rope_theta`, where
they differ).

OLMoE (`OlmoeModel`) keeps Llama's pre-norm layer and norms and puts experts in every layer
(`moe.SparseMoE`: softmax top-k, `norm_topk_prob`, weights rounded to the model's dtype).

With tensor parallelism a rank holds only its heads' columns of q and k: the sums of squares
of a row are all-reduced (one small collective each, k's counted once per replica where KV
heads are replicated), so each rank scales its part by the whole row's norm.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import gemma_rms_norm


class WholeQKNormLayer(LlamaLayer):
    """The Llama layer with q and k normalised over their whole projections (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        c, a, d = model.config, prefix + "self_attn.", model.config.head_dim
        q_norm, k_norm = w[a + "q_norm.weight"], w[a + "k_norm.weight"]
        self.widths = (c.num_heads * d, c.num_kv_heads * d)  # the whole rows' widths
        self.kv_replicas = 1
        if ctx.tp is not None:  # this rank's heads' part of each weight
            lay = ctx.tp.layout
            (q0, q1), (k0, k1) = lay.heads(c.num_heads), lay.kv_heads(c.num_kv_heads)
            q_norm, k_norm = q_norm[q0 * d : q1 * d], k_norm[k0 * d : k1 * d]
            self.kv_replicas = max(1, ctx.tp.size // c.num_kv_heads)
        self.q_norm, self.k_norm = model.norm_weight(q_norm), model.norm_weight(k_norm)
        self.round_first = not c.family.olmo2_norms  # Llama's norm: round, then scale

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = q.shape[0]
        q = self._whole_norm(q.reshape(t, -1), self.q_norm, self.widths[0], 1).view(q.shape)
        k = self._whole_norm(k.reshape(t, -1), self.k_norm, self.widths[1], self.kv_replicas)
        return q, k.view(t, -1, q.shape[-1])

    def _whole_norm(self, x: torch.Tensor, weight: torch.Tensor, width: int, replicas: int):
        """RMSNorm of the rows of `x` over `width` columns, this rank's part of them."""
        ctx = self.ctx
        if ctx.tp is None:
            return ctx.rms_norm(x=x, weight=weight, eps=ctx.eps)
        xf = x.float()
        squares = ctx.tp.all_reduce(xf.square().sum(-1, keepdim=True))
        normed = xf * torch.rsqrt(squares / (replicas * width) + ctx.eps)
        if self.round_first:  # as `ops.rms_norm`
            return normed.to(x.dtype) * weight
        return (normed * weight).to(x.dtype)  # as `gemma_rms_norm`


class Olmo2Layer(WholeQKNormLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.post_mlp_norm = model.norm_weight(w[prefix + "post_feedforward_layernorm.weight"])

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # `mlp_norm` holds post_attention_layernorm: here it normalises attention's output
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        if residual is not None:  # the last layer's MLP branch, normalised, not yet added
            h = h + residual
        h = h + norm(x=self.attention(h, step), weight=self.mlp_norm, eps=eps)
        return norm(x=self.mlp(h), weight=self.post_mlp_norm, eps=eps), h


class Olmo2Model(LlamaModel):
    layer_class = Olmo2Layer
    # `gemma_rms_norm` with the weight as stored: the float32 normalised rows times the 16-bit
    # weight is a float32 product (exactly the weight's value), rounded once
    rms_norm_16bit = staticmethod(gemma_rms_norm)


class OlmoeModel(LlamaModel):
    layer_class = WholeQKNormLayer
    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp


class FlexOlmoModel(Olmo2Model):
    """FlexOlmo (`flex_olmo_config.py`): OLMo 2's layer with OLMoE's experts in every layer."""

    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp
