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
attention layers as OLMo 2's); FP8 is refused (`engine/start_checks.check_dtype`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.delta_rule_config import conv_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.olmo2 import Olmo2Layer, Olmo2Model
from pagoda.runtime.model.qwen3_next import GatedDeltaNet
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
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


class OlmoHybridLayer(RecurrentLayer, Olmo2Layer):
    """OLMo 2's attention layer, or a pre-norm Gated DeltaNet layer then the MLP
    (`recurrent_layer.RecurrentLayer`); the residual adds fused into the norms as Llama's (the
    two kinds hand the stream on alike)."""

    mixer: OlmoGatedDeltaNet | None = None

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> OlmoGatedDeltaNet:
        return OlmoGatedDeltaNet(model.config.family.mamba, w, prefix, index, O_NORM_EPS, ctx)


class OlmoHybridModel(Olmo2Model):
    layer_class = OlmoHybridLayer
