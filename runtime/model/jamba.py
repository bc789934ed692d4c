"""Jamba (`JambaForCausalLM`: AI21's Jamba-v0.1, Jamba 1.5 / 1.6 / 1.7 Mini and Large): each
layer x + mixer(norm(x)), then + mlp(pre_ff_layernorm(x)) (configs read in `jamba_config.py`):

- the mixer: attention without rotary (Llama's, softmax scale head_dim ** -0.5) every
  `attn_layer_period`-th layer from `attn_layer_offset`, else a Mamba-1 mixer
  (`mamba1.Mamba1Mixer`, with Jamba's RMSNorms with weights on dt, B and C) reading its conv and
  SSM state slots (`worker/mamba_state.py`) and the step's slots from ``meta.aux["mamba"]``;
  the Mamba layers' entries of the step's `kv_caches` are empty (no KV cache);
- the MLP (`feed_forward`): Mixtral-style experts (`moe.SparseMoE`: softmax top-k of
  `router`, the weights not renormalised, rounded to the model's dtype) every
  `expert_layer_period`-th layer from `expert_layer_offset`, a dense SwiGLU MLP elsewhere.

The final norm is `model.final_layernorm`. 16 or 32 bits: Mamba-1's mixers do not run in FP8
(`engine/start_checks.check_dtype`). Tensor parallel: the mixers by channels of d_inner
(`Mamba1Mixer.split`; N must divide d_inner, `distributed/layout.check`), each rank's state
slots its channels; attention by heads, the experts and dense MLPs by width. Prefix caching
keeps the attention layers' blocks and the Mamba-1 mixers' state snapshots (`mamba1.py`,
`engine/recurrent.py`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.mamba1 import Mamba1Mixer
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.recurrent_layer import RecurrentLayer

FINAL_NORM = "model.final_layernorm.weight"  # Jamba's name for `model.norm`


class JambaLayer(RecurrentLayer, LlamaLayer):
    """Llama's layer (the residual adds fused into the norms) with the mixer in place of
    attention on the Mamba layers (`recurrent_layer.RecurrentLayer`), the MLP behind
    `pre_ff_layernorm` on both kinds."""

    mixer: Mamba1Mixer | None = None
    mlp_norm_name = "pre_ff_layernorm.weight"

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        if self.mixer is None:  # attention: Llama's, no rotary
            self.mlp_norm = model.read_norm(w, prefix + self.mlp_norm_name)

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> Mamba1Mixer:
        return Mamba1Mixer(model.config.family.mamba, w, prefix, index, ctx)


class JambaModel(LlamaModel):
    layer_class = JambaLayer
    # the experts under `feed_forward.` (`moe_names.NAMES["jamba"]`)
    moe_names = ("feed_forward.", ("gate_proj", "up_proj", "down_proj"))
    moe_router = "router.weight"

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if self.config.family.has_experts(index):
            return SparseMoE.from_weights(self, w, prefix, ctx)
        return GatedMLP(ctx, w, prefix + "feed_forward.")

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        return super().read_norm(w, FINAL_NORM if name == "model.norm.weight" else name)
