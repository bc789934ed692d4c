"""NanoChat (`NanoChatForCausalLM`: karpathy/nanochat-d32 and its kind): Llama's layer with

- RMSNorms without weights (`Llama4TextWeightlessRMSNorm`: in float32, rounded once), the
  checkpoint holding none: each read as ones, which `ops.rms_norm` scales by exactly; one more on
  the token embeddings before the first layer;
- the rotary turning the other way (transformers' NanoChat `rotate_half` is (x2, -x1)): the
  same tables with the sines negated;
- q and k RMS-normalised per head, without weights, after rotary (`after_rotary`);
- an ungated MLP ``fc2(relu(fc1(x))²)`` (`ungated_mlp.UngatedMLP`: fc1 and fc2 read as up and
  down, `safetensors_weights`), no biases;
- the logits soft-capped, ``cap * tanh(logits / cap)`` (`final_logit_softcapping`, 15 by
  default), an untied head.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.llama4 import _l2_norm
from pagoda.runtime.model.ungated_mlp import UngatedMLP


class NanoChatLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.attn_norm = self.mlp_norm = model.norm  # (ones: none stored)

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.ctx.eps
        return _l2_norm(q, eps), _l2_norm(k, eps)


class NanoChatModel(LlamaModel):
    layer_class = NanoChatLayer

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        return torch.ones(self.config.hidden_size, dtype=self.dtype, device=self.device)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        caches = super().build_rope_caches(max_positions)
        for cache in caches.values():  # cat(cos, sin) rows: the sines negated
            cache[:, cache.shape[-1] // 2 :].neg_()
        return caches

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        return self.rms_norm(x=h, weight=self.norm, eps=self.config.rms_norm_eps)

    def logits(self, x, head):
        cap = self.config.family.final_logit_softcapping
        if not cap:
            return super().logits(x, head)
        return torch.tanh(self.lm_head(x) / cap) * cap
