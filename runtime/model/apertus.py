"""Apertus (`ApertusForCausalLM`: Apertus-8B, 70B): Qwen3's layer (an RMSNorm over each head
of q and of k before rotary) with

- its norms named `attention_layernorm` (before attention) and `feedforward_layernorm`
  (before the MLP) where Llama's are `input_layernorm` and `post_attention_layernorm`;
- an ungated MLP, ``down(xielu(up(x)))`` (`ungated_mlp.UngatedMLP`), xIELU's parameters per
  layer from the checkpoint (`mlp.act_fn.alpha_p`, `alpha_n`, `beta`, `eps`);
- llama3 rotary scaling by default (transformers' ApertusConfig, when config.json names none).
"""

from __future__ import annotations

from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.qwen3 import Qwen3Layer
from pagoda.runtime.model.ungated_mlp import UngatedMLP


class ApertusLayer(Qwen3Layer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.attn_norm = model.read_norm(w, prefix + "attention_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "feedforward_layernorm.weight")


class ApertusModel(LlamaModel):
    layer_class = ApertusLayer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)
