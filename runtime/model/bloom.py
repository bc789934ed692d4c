"""ALiBi models (`alibi.py`: no rotary, a per-head linear bias the attention backend adds).

- BLOOM (`BloomForCausalLM`): Llama's sequential layer over StarCoder2's LayerNorms (weight and
  bias, eps `layer_norm_epsilon`), a LayerNorm on the embeddings
  (`word_embeddings_layernorm`, read as `model.embed_layernorm`), a fused `query_key_value`
  with q, k and v of each head in turn (`falcon.split_qkv`, "per_head"), an ungated MLP
  ``dense_4h_to_h(gelu_tanh(dense_h_to_4h(x)))``, biases everywhere, a tied head; BLOOM's
  slopes. `apply_residual_connection_post_layernorm` is refused when the config is read.
- MPT (`MPTForCausalLM`): Llama's sequential layer over LayerNorms with a weight and no bias
  (`norm_1`, `norm_2`, `norm_f`, as transformers builds them), q, k, v stacked in `Wqkv`
  (clamped to [-clip_qkv, clip_qkv] where `attn_config` says), no biases, an exact-GELU MLP
  (`ffn.up_proj` / `down_proj`), a tied head; MPT's slopes (`attn_config.alibi_bias_max`, 8 by default), the softmax
  scale `attn_config.softmax_scale` where set. Its tensors read under Llama's names
  (`safetensors_weights`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.olmo import OlmoLayer
from pagoda.runtime.model.starcoder2 import Starcoder2Model, layer_norm
from pagoda.runtime.model.ungated_mlp import UngatedMLP

EMBED_NORM = "model.embed_layernorm.weight"


class BloomModel(Starcoder2Model):
    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        self.embed_norm = self.read_norm(w, EMBED_NORM) if EMBED_NORM in w else None

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.embed_norm is None:  # (MPT)
            return h
        return layer_norm(x=h, weight=self.embed_norm, eps=self.config.rms_norm_eps)


class MptModel(BloomModel):
    layer_class = OlmoLayer  # Llama's, q/k/v clamped to ±clip_qkv where the config says

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        weight = w[name]  # (no bias: zeros, so that StarCoder2's LayerNorm serves)
        return torch.stack([weight, torch.zeros_like(weight)])
