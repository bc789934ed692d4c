"""Nemotron (`NemotronForCausalLM`: Nemotron-4, Minitron, Nemotron-Mini): StarCoder2's model
(`starcoder2.py`: LayerNorm with a weight and a bias, in the model's dtype) with

- LayerNorm1P: the norm scales by 1 + w (added in the model's dtype, as transformers'
  `weight + 1.0`), the final norm too, eps `norm_eps`;
- an ungated MLP, ``down(relu(up(x))²)`` (`ungated_mlp.UngatedMLP`, ReLU²), biases where
  `mlp_bias` says;
- a partial rotary (`partial_rotary_factor`, default 0.5): the first dims of each head rotate.

Jais 2 (`Jais2ForCausalLM`) is this model without the 1 + w (plain LayerNorm with biases) and
with a full rotary (`Jais2Model`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.starcoder2 import Starcoder2Model
from pagoda.runtime.model.ungated_mlp import UngatedMLP


class Jais2Model(Starcoder2Model):
    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)


class NemotronModel(Jais2Model):
    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        weight, bias = super().read_norm(w, name)
        return torch.stack([weight + 1.0, bias])
