"""Gemma 2 (`Gemma2ForCausalLM`): the Llama layer with Gemma's differences (Gemma 3, `gemma3.py`,
builds on these classes and adds q/k norms and a rotary base per layer kind).

- RMSNorm scales by (1 + w), in float32 before rounding once (`ops.gemma_rms_norm`);
- four norms a layer: after attention and after the MLP too, each before its residual add;
- GeGLU (gelu with the tanh approximation) in the MLP;
- the embedding scaled by sqrt(hidden_size) rounded to the model's dtype, as Hugging Face does;
- softmax scale query_pre_attn_scalar ** -0.5; the attention scores soft-capped,
  cap * tanh(scores / cap) (`attn_logit_softcapping`: the attention backend's `softcap`, which
  the torch, Triton and kernel reference paths apply; the CPU's native kernel does not take
  one, and a capped model leaves it for the torch path), and the final logits too;
- sliding-window layers alternating with global ones (`FamilyConfig.window_layers`: even
  layers slide unless config.json's `layer_types` says otherwise).

Gemma (`GemmaForCausalLM`, v1: gemma-2b/7b, CodeGemma) is this model with Llama's layer: two
norms a layer, before attention and before the MLP, no soft caps, no window (`GemmaModel`).
VaultGemma (`VaultGemmaForCausalLM`) is Gemma 2's model with Llama's layer too, its norm before
the MLP named `pre_feedforward_layernorm` (none after attention or the MLP: `VaultGemmaModel`).
"""

from __future__ import annotations

import math

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step
from pagoda.runtime.model.ops import gemma_rms_norm


class Gemma2Layer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.pre_mlp_norm = model.norm_weight(w[prefix + "pre_feedforward_layernorm.weight"])
        self.post_mlp_norm = model.norm_weight(w[prefix + "post_feedforward_layernorm.weight"])

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # `mlp_norm` holds post_attention_layernorm: here it normalises attention's output
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        x, residual = self.attention_input(h, residual)
        h = norm(x=self.attention(x, step), weight=self.mlp_norm, eps=eps)
        x, residual = norm(x=h, weight=self.pre_mlp_norm, eps=eps, residual=residual)
        return norm(x=self.mlp(x), weight=self.post_mlp_norm, eps=eps), residual


class Gemma2Model(LlamaModel):
    layer_class = Gemma2Layer
    # (1 + w) * norm(x) in float32, rounded once (`norm_weight` gives 1 + w); GeGLU: LlamaModel's,
    # by hidden_act
    rms_norm_16bit = staticmethod(gemma_rms_norm)

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        # sqrt(hidden) as Hugging Face holds it: a float32 tensor, rounded to the model's dtype
        scale = torch.tensor(math.sqrt(config.hidden_size), dtype=torch.float32)
        self.embed_scale = scale.to(device=self.device, dtype=self.dtype)

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """1 + w in float32, as Gemma's norm computes it (then the model's dtype for float32);
        GGUF files hold 1 + w already."""
        one_plus = weight.float()
        if not self.config.family.norms_hold_one_plus_w:
            one_plus = 1.0 + one_plus
        return one_plus if self.dtype != torch.float32 else one_plus.to(self.dtype)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().embed_tokens(input_ids) * self.embed_scale

    def logits(self, x, head):
        cap = self.config.family.final_logit_softcapping
        if not cap:
            return super().logits(x, head)
        logits = self.lm_head(x)
        return torch.tanh(logits / cap) * cap


class GemmaModel(Gemma2Model):
    layer_class = LlamaLayer


class VaultGemmaLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.mlp_norm = model.read_norm(w, prefix + "pre_feedforward_layernorm.weight")


class VaultGemmaModel(Gemma2Model):
    layer_class = VaultGemmaLayer
