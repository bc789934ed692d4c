"""StarCoder2 (`Starcoder2ForCausalLM`: starcoder2-3b/7b/15b): Mistral's layer with

- LayerNorm with a weight and a bias for RMSNorm (`layer_norm`, in the model's dtype as
  `nn.LayerNorm`), the final norm too, eps `norm_epsilon`; a norm's weight and bias are held
  stacked as one [2, hidden] tensor, so the norm keeps `ops.rms_norm`'s signature;
- an ungated MLP, ``c_proj(gelu_tanh(c_fc(x)))`` (`ungated_mlp.UngatedMLP`), with biases;
- biases on q, k, v and o (`use_bias`, default true), and Mistral's `sliding_window`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.ungated_mlp import UngatedMLP


def layer_norm(
    *, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """LayerNorm by `weight` [2, hidden] (the weight, the bias); `ops.rms_norm`'s signature
    (with `residual`: (norm(x + r), x + r), added in place)."""
    if residual is not None:
        residual.add_(x)
        x = residual
    out = F.layer_norm(x, weight.shape[-1:], weight[0], weight[1], eps)
    return out if residual is None else (out, residual)


class Starcoder2Model(LlamaModel):
    def layer_context(self, linear: Callable[..., Linear]) -> LayerContext:
        return dataclasses.replace(super().layer_context(linear), rms_norm=layer_norm)

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        return torch.stack([w[name], w[name.removesuffix("weight") + "bias"]])

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        f = self.config.family
        return UngatedMLP(ctx, w, prefix + "mlp.", f.hidden_act, names=("c_fc", "c_proj"))
