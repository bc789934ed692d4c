"""MiniCPM3 (`MiniCPM3ForCausalLM`: MiniCPM3-4B): DeepSeek-V2's latent attention
(`deepseek.DeepseekLayer`, its rotary in the rotate-half layout: `rope_interleave` false) over a
dense SwiGLU MLP, with muP's scales (Granite's fields in `FamilyConfig`):

- the token embeddings times `scale_emb`, rounded to the model's dtype as transformers holds it;
- each sublayer's output times scale_depth / sqrt(num_hidden_layers) before its residual add
  (`granite.GraniteLayer.__call__`);
- the final hidden states divided by hidden_size / dim_model_base before the LM head (not the
  logits after it, as Granite's).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.deepseek import DeepseekLayer, DeepseekModel
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.granite import GraniteLayer
from pagoda.runtime.model.llama import LayerContext, LlamaModel


class MiniCPM3Layer(DeepseekLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.residual_multiplier = model.config.family.residual_multiplier

    __call__ = GraniteLayer.__call__  # each sublayer's output scaled before its residual add


class MiniCPM3Model(DeepseekModel):
    layer_class = MiniCPM3Layer

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        scale = torch.tensor(config.family.embedding_multiplier, dtype=torch.float32)
        self.embed_scale = scale.to(device=self.device, dtype=self.dtype)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().embed_tokens(input_ids) * self.embed_scale

    def logits(self, x, head):
        return super().logits(x / self.config.family.logits_scaling, head)
