"""Qwen3: the Llama layer plus an RMSNorm over each head of q and of k before rotary (Hunyuan's
models: after it, `hunyuan.py`).

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
