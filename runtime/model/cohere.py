"""Cohere (`CohereForCausalLM`: Command R, R+, Aya) and Cohere 2 (`Cohere2ForCausalLM`: Command
R7B, Command A): the Llama layer with Cohere's differences (`FamilyConfig.cohere_layer`).

- LayerNorm with a weight and no bias for RMSNorm (`layer_norm`: mean-subtracted, normalised
  and scaled in float32, rounded once), the final norm too, eps `layer_norm_eps`;
- one norm a layer, attention and the MLP side by side off it: ``x + attn(n) + mlp(n)``, added
  in that order (the MLP's output is handed on to the next layer's norm as Llama's is);
- the rotary in the interleaved layout, pairs (2i, 2i + 1) (`ops.rotary_interleaved`), in
  float32 and rounded once;
- the logits multiplied by `logit_scale` (`FamilyConfig.logit_scale`); tied embeddings;
- Cohere with `use_qk_norm` (Command R+ 08-2024): a LayerNorm over each head of q and of k
  before rotary, with a weight per head ([heads, head_dim]; a rank reads its heads' rows);
- Cohere 2: window layers (`layer_types`, or every `sliding_window_pattern`-th layer global),
  which rotate, and global layers without rotary (NoPE, `FamilyConfig.rope_layers`);
- Cohere 2 MoE (`Cohere2MoeModel`, `cohere2_moe_config.py`): Cohere 2's with experts, and
  Llama's RMSNorm where its config says;
- Cohere Compass (`cohere_compass_config.py`): Cohere 2's with the rotary by layer kind, in
  Llama's rotate-half layout (`FamilyConfig.rope_interleaved` false).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import rotary_interleaved


def layer_norm(
    *, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """Cohere's LayerNorm (no bias) in float32, scaled by the float32 weight, rounded once;
    `ops.rms_norm`'s signature (with `residual`: (norm(x + r), x + r), added in place)."""
    if residual is not None:
        residual.add_(x)
        x = residual
    out = F.layer_norm(x.float(), weight.shape[-1:], weight, None, eps).to(x.dtype)
    return out if residual is None else (out, residual)


class CohereLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        if model.config.family.rope_interleaved:  # (Cohere Compass's rotates halves: Llama's)
            self.rotary = functools.partial(rotary_interleaved, widen=True)  # in float32, as HF
        self.q_norm = self.k_norm = None
        if model.config.family.qk_norm:  # [heads, head_dim]: this rank's heads' rows
            c, a, tp = model.config, prefix + "self_attn.", ctx.tp
            q0, q1 = (0, c.num_heads) if tp is None else tp.layout.heads(c.num_heads)
            k0, k1 = (0, c.num_kv_heads) if tp is None else tp.layout.kv_heads(c.num_kv_heads)
            self.q_norm = model.norm_weight(w[a + "q_norm.weight"][q0:q1])
            self.k_norm = model.norm_weight(w[a + "k_norm.weight"][k0:k1])

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.q_norm is None:
            return q, k
        eps, d = self.ctx.eps, q.shape[-1]
        q = (F.layer_norm(q.float(), (d,), None, None, eps) * self.q_norm).to(q.dtype)
        k = (F.layer_norm(k.float(), (d,), None, None, eps) * self.k_norm).to(k.dtype)
        return q, k

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)  # the last layer's output added
        residual = residual.add_(self.attention(x, step))  # x + attn(n), then + mlp(n)
        return self.mlp(x), residual


class CohereModel(LlamaModel):
    layer_class = CohereLayer

    def layer_context(self, linear: Callable[..., Linear]) -> LayerContext:
        ctx = super().layer_context(linear)
        if self.config.family.cohere_rms_norm:  # Llama's RMSNorm (Cohere 2 MoE's option)
            return ctx
        return dataclasses.replace(ctx, rms_norm=layer_norm)

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """In float32, as the LayerNorm scales by it (`layer_norm`); Llama's RMSNorm's as
        stored."""
        return weight if self.config.family.cohere_rms_norm else weight.float()

    def logits(self, x, head):
        scale = self.config.family.logit_scale
        if scale == 1.0:
            return super().logits(x, head)
        return self.lm_head(x) * scale


class Cohere2MoeModel(CohereModel):
    """Cohere 2 MoE (`cohere2_moe_config.py`): Cohere 2's layer with dense MLPs where
    `mlp_layer_types` says, experts elsewhere (`moe.make_mlp`: the top-k router, the shared
    MLP summed or averaged with them)."""

    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp
