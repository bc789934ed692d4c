"""Falcon-H1 (`FalconH1ForCausalLM`: Falcon-H1 0.5B to 34B): in every layer, attention (Llama's,
with rotary) and a Mamba2 mixer (`mamba2.Mamba2Mixer`) side by side on the same normalised
input, their outputs summed, then Llama's MLP after `pre_ff_layernorm`; the final norm is
`final_layernorm`. Every layer keeps both a KV cache and a Mamba state.

Its µP multipliers (`recurrent_configs.FalconH1Scales`, 1.0 where config.json has none): the embedding
and the logits scaled; k scaled before rotary; attention's input and output scaled, and the
mixer's (its input before `in_proj`, in_proj's z, x, B, C and dt parts each by its own, the
output); the MLP's gate before the activation and its output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.granite_hybrid import BAMBA_FINAL_NORM
from pagoda.runtime.model.llama import (
    GatedMLP,
    LayerContext,
    LlamaLayer,
    LlamaModel,
    Step,
)
from pagoda.runtime.model.mamba2 import MAMBA_STEP, Mamba2Mixer


class FalconMLP(GatedMLP):
    """down(silu(gate(x) * gate_scale) * up(x)) * down_scale, gate and up in one matmul."""

    __slots__ = ("down_scale", "gate_scale")

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str, gate: float, down: float):
        super().__init__(ctx, w, prefix)
        self.gate_scale, self.down_scale = gate, down

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        y = self.down(up * F.silu(gate * self.gate_scale))
        return y * self.down_scale if self.down_scale != 1.0 else y


class FalconH1Layer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        c = model.config
        self.mlp_norm = model.read_norm(w, prefix + "pre_ff_layernorm.weight")
        self.mixer = Mamba2Mixer(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx)
        self.s = c.family.mamba.falcon

    def linears(self):
        return [*super().linears(), *self.mixer.linears()]

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, (k * self.s.key if self.s.key != 1.0 else k)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.s
        x, residual = self.attention_input(h, residual)
        ssm = self.mixer(x, step.meta.aux[MAMBA_STEP]) * s.ssm_out
        attn = self.attention(x * s.attention_in if s.attention_in != 1.0 else x, step)
        h = ssm + attn * s.attention_out
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        return self.mlp(x), residual


class FalconH1Model(LlamaModel):
    layer_class = FalconH1Layer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        s = self.config.family.mamba.falcon
        return FalconMLP(ctx, w, prefix + "feed_forward.", s.mlp_gate, s.mlp_down)

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        if name == "model.norm.weight" and name not in w:  # (a GGUF's output_norm: Llama's)
            name = BAMBA_FINAL_NORM  # (Bamba's name too)
        return super().read_norm(w, name)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        e = super().embed_tokens(input_ids)
        scale = self.config.family.mamba.falcon.embedding
        return e * scale if scale != 1.0 else e

    def logits(self, x, head):
        scale = self.config.family.mamba.falcon.lm_head  # (1.0: the sampling fused into the head)
        return super().logits(x, head) if scale == 1.0 else self.lm_head(x) * scale
