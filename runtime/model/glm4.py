"""GLM-4 (`Glm4ForCausalLM`: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1) and GLM (`GlmForCausalLM`:
GLM-4-9B-chat-hf): the Llama layer with GLM's differences, most of them read as Llama's.

- the MLP's gate and up come fused in one `mlp.gate_up_proj` (listed as Llama's gate and up
  rows by `phi3.split_fused`, so tensor parallelism cuts each by width);
- a partial rotary (`partial_rotary_factor`, 0.5 by default: the first half of each head
  rotates) in the interleaved layout: the pairs (2i, 2i + 1) (`ops.rotary_interleaved`,
  `FamilyConfig.rope_interleaved`);
- biases on q, k and v (`attention_bias`, default true), none on o;
- GLM-4 only (`Glm4Layer`): two more RMSNorms a layer, on attention's output
  (`post_self_attn_layernorm`) and on the MLP's (`post_mlp_layernorm`), each before its residual
  add; `post_attention_layernorm` stays the MLP's input norm. GLM is Llama's layer as it stands.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step


class Glm4Layer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.post_attn_norm = model.norm_weight(w[prefix + "post_self_attn_layernorm.weight"])
        self.post_mlp_norm = model.norm_weight(w[prefix + "post_mlp_layernorm.weight"])

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        x, residual = self.attention_input(h, residual)  # the last MLP branch, normalised, added
        h = norm(x=self.attention(x, step), weight=self.post_attn_norm, eps=eps)
        x, residual = norm(x=h, weight=self.mlp_norm, eps=eps, residual=residual)
        return norm(x=self.mlp(x), weight=self.post_mlp_norm, eps=eps), residual


class Glm4Model(LlamaModel):
    layer_class = Glm4Layer
