"""Qwen3: the Llama layer plus an RMSNorm over each head of q and of k before rotary (Hunyuan's
models: after it, `hunyuan.py`).

Qwen3-MoE (`moe.py`) and Gemma 3 (`gemma3.py`, with its own norm) build on this layer.
`GatedQuery` is Qwen3-Next's gated attention (`qwen3_next.py`; MiniCPM5-MoE's, `glm4_moe.py`):
q_proj gives each head's query and then its output gate, attention's output times
sigmoid(gate) before o_proj.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel


class GatedQuery:
    """Mixed in before a Llama layer class: its q_proj [heads * 2 * head_dim] holds each head's
    query, then its gate (interleaved per head), read with k and v as one matrix [q, k, v, gate]
    (`read_gated_qkv`, the layer's [q, k, v] replaced); with tensor parallelism this rank's
    query heads and KV heads (`layout.heads`, `kv_heads`)."""

    _gate: torch.Tensor | None = None

    def read_gated_qkv(self, model: LlamaModel, w: DeviceWeights, prefix: str, ctx) -> None:
        c = model.config
        a, d = prefix + "self_attn.", c.head_dim
        q, gate = w[a + "q_proj.weight"].view(c.num_heads, 2, d, -1).unbind(1)
        k, v = w[a + "k_proj.weight"], w[a + "v_proj.weight"]
        if ctx.tp is not None:
            (h0, h1), (k0, k1) = ctx.tp.layout.heads(c.num_heads), ctx.tp.layout.kv_heads(
                c.num_kv_heads)  # fmt: skip
            q, gate, k, v = q[h0:h1], gate[h0:h1], k[k0 * d : k1 * d], v[k0 * d : k1 * d]
        qkvg = [q.reshape(-1, q.shape[-1]), k, v, gate.reshape(-1, gate.shape[-1])]
        self.qkv = ctx.linear(torch.cat(qkvg))
        self._gate = None

    def qkv_heads(self, x: torch.Tensor):
        ctx = self.ctx
        t, d = x.shape[0], ctx.head_dim
        q, k, v, self._gate = self.qkv(x).split([*ctx.qkv_sizes, ctx.num_heads * d], dim=-1)
        return (q.reshape(t, ctx.num_heads, d), k.reshape(t, ctx.num_kv_heads, d),
                v.reshape(t, ctx.num_kv_heads, d))  # fmt: skip

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        gate, self._gate = self._gate, None
        return out * torch.sigmoid(gate)


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
