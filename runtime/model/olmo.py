"""OLMo (`OlmoForCausalLM`, v1: OLMo-1B-hf, OLMo-7B-hf, OLMo-1.7-7B): Llama's layer with

- a LayerNorm without weight or bias for RMSNorm (`layer_norm`: in float32, eps 1e-5 as
  transformers fixes it, rounded once), the final norm too: the checkpoint holds no norms;
- with `clip_qkv`, q, k and v clamped to [-clip_qkv, clip_qkv] after their projection
  (`ClampedLinear`, around the fused q/k/v matmul: elementwise, so each rank clamps its part).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel

EPS = 1e-5  # OlmoLayerNorm's, whatever config.json says


def layer_norm(*, x: torch.Tensor, weight: None, eps: float, residual: torch.Tensor | None = None):
    """OLMo's parameter-free LayerNorm; `ops.rms_norm`'s signature (with `residual`:
    (norm(x + r), x + r), added in place)."""
    if residual is not None:
        residual.add_(x)
        x = residual
    out = F.layer_norm(x.float(), x.shape[-1:], None, None, EPS).to(x.dtype)
    return out if residual is None else (out, residual)


class ClampedLinear:
    """A linear layer whose outputs are clamped to [-clip, clip] in place."""

    __slots__ = ("clip", "inner")

    def __init__(self, inner, clip: float) -> None:
        self.inner, self.clip = inner, clip

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).clamp_(-self.clip, self.clip)


class OlmoLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.linear_qkv = self.qkv
        clip = model.config.family.clip_qkv
        if clip is not None:
            self.qkv = ClampedLinear(self.qkv, clip)

    def linears(self) -> list[Linear]:
        return [self.linear_qkv, self.o_proj, *self.mlp.linears()]


class OlmoModel(LlamaModel):
    layer_class = OlmoLayer

    def layer_context(self, linear: Callable[..., Linear]) -> LayerContext:
        return dataclasses.replace(super().layer_context(linear), rms_norm=layer_norm)

    def read_norm(self, w: DeviceWeights, name: str) -> None:
        return None  # (none stored)
