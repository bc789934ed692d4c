"""Qwen3: the Llama layer plus an RMSNorm over each head of q and of k before rotary (HunYuan's
dense models: after it, `HunYuanDenseModel`).

Qwen3-MoE (`moe.py`) and Gemma 3 (`gemma3.py`, with its own norm) build on this layer.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel


class Qwen3Layer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        a = prefix + "self_attn."
        self.q_norm = model.norm_weight(w[a + "q_norm.weight"])  # [head_dim], shared by heads
        self.k_norm = model.norm_weight(w[a + "k_norm.weight"])

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's row normalised on its own, as Hugging Face's `q_norm(q.view(..., D))`."""
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        q = norm(x=q.reshape(-1, q.shape[-1]), weight=self.q_norm, eps=eps).view(q.shape)
        k = norm(x=k.reshape(-1, k.shape[-1]), weight=self.k_norm, eps=eps).view(k.shape)
        return q, k


class Qwen3Model(LlamaModel):
    layer_class = Qwen3Layer


class HunYuanDenseLayer(Qwen3Layer):
    """HunYuan's (`HunYuanDenseV1ForCausalLM`): Qwen3's per-head q/k RMSNorms after rotary, not
    before (`query_layernorm` / `key_layernorm`, read as q_norm / k_norm)."""

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    after_rotary = Qwen3Layer.before_rotary


class HunYuanDenseModel(LlamaModel):
    """HunYuan dense (Hunyuan-0.5B/1.8B/4B/7B): `HunYuanDenseLayer`; its NTK rotary with a fixed
    `alpha` is the default rotary over base theta * alpha ** (d / (d - 2)) (read so by
    `family_fields`)."""

    layer_class = HunYuanDenseLayer
