"""EXAONE 4 (`Exaone4ForCausalLM`: EXAONE-4.0-1.2B, 32B): OLMo 2's layer with Qwen3's q/k norms.

- no norm on a sublayer's input: ``h = h + norm(attention(h))``, then ``h = h + norm(mlp(h))``
  (post_attention_layernorm, post_feedforward_layernorm; `olmo2.Olmo2Layer.__call__`), with
  Llama's RMSNorm (rounded, then scaled: not OLMo 2's float32 scaling);
- an RMSNorm over each head of q and of k before rotary (`qwen3.Qwen3Layer`);
- with a `sliding_window`, window layers (`layer_types`, or every `sliding_window_pattern`-th
  layer global) that rotate and global layers without rotary (NoPE,
  `FamilyConfig.rope_layers`); without one, every layer is global and rotates.
"""

from __future__ import annotations

from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.olmo2 import Olmo2Layer
from pagoda.runtime.model.qwen3 import Qwen3Layer


class Exaone4Layer(Qwen3Layer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.post_mlp_norm = model.norm_weight(w[prefix + "post_feedforward_layernorm.weight"])

    __call__ = Olmo2Layer.__call__  # norms after the sublayers


class Exaone4Model(LlamaModel):
    layer_class = Exaone4Layer
