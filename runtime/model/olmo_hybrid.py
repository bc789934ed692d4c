"""OLMo Hybrid (`OlmoHybridForCausalLM`; config read in `olmo_hybrid_config.py`): OLMo 3's
attention layers (`olmo2.Olmo2Layer`: q/k normalised over the whole projections, the norms
after the sublayers; no windows; NoPE where the config names no rotary base) among Gated
DeltaNet layers, Llama's pre-norm layer around Qwen3-Next's mixer (`qwen3_next.GatedDeltaNet`,
the gated delta rule of `gated_delta.py` in the hybrids' state slots). Its DeltaNet differs
from Qwen3-Next's only in

- separate projections q_proj, k_proj, v_proj (the conv's channels), g_proj (the output gate,
  Qwen3-Next's z), b_proj, a_proj: read into the one [q, k, v, z, b, a] matrix at load; the
  published checkpoints' conv in three parts (q_conv1d, k_conv1d, v_conv1d: concatenated) and
  their norms under OLMo-core's names (`olmo_hybrid_config.rename_norms`);
- beta = 2 sigmoid(b) where `linear_allow_neg_eigval` (the default);
- the gated norm `o_norm` (eps 1e-5 whatever rms_norm_eps says, as transformers'), `o_proj`.

Every RMSNorm scales in float32 before rounding once (OLMo 2's: `ops.gemma_rms_norm` with the
weight as stored). Prefix caching and tensor parallelism as Qwen3-Next's (by key heads; the
attention layers as OLMo 2's); FP8 is refused (`engine/core.check_dtype`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step
from pagoda.runtime.model.mamba2 import MAMBA_STEP
from pagoda.runtime.model.olmo2 import Olmo2Layer, Olmo2Model
from pagoda.runtime.model.olmo_hybrid_config import conv_names
from pagoda.runtime.model.qwen3_next import GatedDeltaNet
from pagoda.runtime.recurrent_configs import MambaConfig

O_NORM_EPS = 1e-5  # FLA's FusedRMSNormGated default, which transformers keeps


class OlmoGatedDeltaNet(GatedDeltaNet):
    """Qwen3-Next's mixer under OLMo Hybrid's names (module docstring)."""

    out_name, norm_name = "o_proj.weight", "o_norm.weight"

    def in_proj_weight(self, m: MambaConfig, w: DeviceWeights, p: str) -> torch.Tensor:
        names = ("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj")
        return torch.cat([w[f"{p}{n}.weight"] for n in names])

    def conv_weight_of(self, w: DeviceWeights, p: str) -> torch.Tensor:
        return torch.cat([w[n] for n in conv_names(p, w)])


class OlmoHybridLayer(Olmo2Layer):
    """OLMo 2's attention layer, or a pre-norm Gated DeltaNet layer then the MLP; the residual
    adds fused into the norms as Llama's (the two kinds hand the stream on alike)."""

    linear_attn: OlmoGatedDeltaNet | None = None

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        m = model.config.family.mamba
        if not m.layers[index]:
            super().__init__(model, w, prefix, index, ctx)
            return
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        self.mlp = model.make_mlp(w, prefix, index, ctx)
        self.linear_attn = OlmoGatedDeltaNet(m, w, prefix, index, O_NORM_EPS, ctx)

    def linears(self):
        if self.linear_attn is None:
            return super().linears()
        return [*self.linear_attn.linears(), *self.mlp.linears()]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.linear_attn is None:
            return super().__call__(h, residual, step)
        x, residual = self.attention_input(h, residual)
        h = self.linear_attn(x, step.meta.aux[MAMBA_STEP])
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        return self.mlp(x), residual


class OlmoHybridModel(Olmo2Model):
    layer_class = OlmoHybridLayer
