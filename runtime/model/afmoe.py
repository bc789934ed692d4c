"""AfMoE (`AfmoeForCausalLM`: arcee-ai's Trinity), as transformers runs it:

- four norms a layer as Gemma's (after attention, before and after the MLP, each branch normed
  before its residual add: `gemma2.Gemma2Layer.__call__`), but `pre_mlp_layernorm` /
  `post_mlp_layernorm` by name and w, not 1 + w, scaling in float32 before rounding once
  (`ops.gemma_rms_norm`, as OLMo 2's);
- Qwen3's per-head q/k norms before rotary; the window layers (`layer_types`, by default all
  but every `global_attn_every_n_layers`-th) rotate, the global ones attend without rotary;
- attention's output gated per element, ``out * sigmoid(gate_proj(x))`` before o_proj
  (`self_attn.gate_proj`, split by heads under tensor parallelism as q);
- with `mup_enabled`, the embedding scaled by sqrt(hidden_size);
- dense MLPs in the first `num_dense_layers` layers, then experts picked by the sigmoid of the
  router's logits (`mlp.router.gate`) plus a choice-only bias (`mlp.expert_bias`), weighted by
  the uncorrected scores renormalised, times `route_scale` (`moe_routing.GroupedRouter`), beside
  ungated shared experts of `moe_intermediate_size x num_shared_experts`.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model import moe_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gemma2 import Gemma2Layer
from pagoda.runtime.model.llama import LayerContext, LlamaModel, linear_layer
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.parallel_linear import column_linear
from pagoda.runtime.model.qwen3 import Qwen3Layer


class AfmoeLayer(Qwen3Layer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.pre_mlp_norm = model.norm_weight(w[prefix + "pre_mlp_layernorm.weight"])
        self.post_mlp_norm = model.norm_weight(w[prefix + "post_mlp_layernorm.weight"])
        gate, c = prefix + "self_attn.gate_proj.weight", model.config
        if ctx.tp is None:
            self.gate = linear_layer(ctx, w, [gate])
        else:  # this rank's heads' rows, as q's
            q0, q1 = ctx.tp.layout.heads(c.num_heads)
            self.gate = column_linear(ctx, w, [gate], [(q0 * c.head_dim, q1 * c.head_dim)])

    __call__ = Gemma2Layer.__call__  # norms after the sublayers too

    def linears(self):
        return [*super().linears(), self.gate]

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out * torch.sigmoid(self.gate(x))


_NAMES = moe_names.of("afmoe")


class AfmoeModel(LlamaModel):
    layer_class = AfmoeLayer
    rms_norm_16bit = staticmethod(gemma_rms_norm)  # float32 scaling, rounded once
    moe_names = (_NAMES.block, _NAMES.experts)
    moe_router, moe_bias = _NAMES.router, _NAMES.bias
    make_mlp = make_mlp

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        scale = self.config.family.embedding_multiplier  # sqrt(hidden_size) with mup_enabled
        embedded = super().embed_tokens(input_ids)
        return embedded if scale == 1.0 else embedded * scale
