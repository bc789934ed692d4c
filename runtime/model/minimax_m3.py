"""MiniMax-M3's text model (`MiniMaxM3VLForCausalLM`; config read in `minimax_m3_config.py`), as
transformers' `modeling_minimax_m3_vl.py` computes it: MiniMax-M2's model (`minimax_m2.py`:
sigmoid router with a choice-only correction bias, renormalised) with

- Gemma's RMSNorm (1 + w, scaled in float32, rounded once) everywhere, and per-head q/k norms
  before rotary (Qwen3's layer) in place of M2's whole-projection ones;
- gpt-oss's clamped SwiGLU (`gpt_oss.swiglu_oai`: (clamp(up) + 1) * g * sigmoid(alpha * g),
  g = min(gate, limit)) in every MLP: the dense layers' (`mlp_layer_types`), the routed experts'
  (stacked `experts.gate_up_proj` [E, 2I, hidden] gate rows then up, `experts.down_proj`; the
  fused-MoE kernel's `swiglu_oai` on CUDA) and the ungated shared expert's, each MLP's gate and
  up stored as one `gate_up_proj`;
- the routed experts' sum x `routed_scaling_factor`, then + the shared expert;
- the `minimax_m3_sparse` layers' lightning indexer keeps every key block within
  `index_topk_blocks` x `index_block_size` tokens: the context is bounded there and those
  layers attend densely, their indexer tensors not read (`minimax_m3_config`).

Tensor parallelism, FP8 and an FP8 checkpoint are refused (`family_options`).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gpt_oss import swiglu_oai
from pagoda.runtime.model.llama import GatedMLP, LayerContext, linear_layer
from pagoda.runtime.model.moe import SharedExpertMoE, SparseMoE
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.qwen3 import Qwen3Model


class FusedGateUpMLP(GatedMLP):
    """down(act(gate_up(x))), gate and up stored as one `gate_up_proj` (gate rows first)."""

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str) -> None:
        self.gate_up = linear_layer(ctx, w, [prefix + "gate_up_proj.weight"])
        self.down = linear_layer(ctx, w, [prefix + "down_proj.weight"])
        self.act_and_mul = ctx.act_and_mul


class MiniMaxM3Model(Qwen3Model):
    rms_norm_16bit = staticmethod(gemma_rms_norm)
    moe_names = ("mlp.", ("gate_up_proj", "down_proj"))
    moe_suffix = ""  # (experts.gate_up_proj, experts.down_proj: stacked, no `.weight`)

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """1 + w in float32, as Gemma's norm computes it (the model's dtype for float32)."""
        one_plus = 1.0 + weight.float()
        return one_plus if self.dtype != torch.float32 else one_plus.to(self.dtype)

    def layer_context(self, linear) -> LayerContext:
        f = self.config.family
        act = functools.partial(_swiglu_oai, alpha=f.swiglu_alpha, limit=f.swiglu_limit)
        return dataclasses.replace(super().layer_context(linear), act_and_mul=act)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        f = self.config.family
        if not f.has_experts(index):
            return FusedGateUpMLP(ctx, w, prefix + "mlp.")
        routed = SparseMoE.from_weights(self, w, prefix, ctx)
        routed.fused_activation = dict(
            activation="swiglu_oai", alpha=f.swiglu_alpha, limit=f.swiglu_limit
        )
        return SharedExpertMoE(routed, FusedGateUpMLP(ctx, w, prefix + "mlp.shared_experts."), None)


def _swiglu_oai(*, x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """`gpt_oss.swiglu_oai` as the layers' `act_and_mul` (keyword `x`)."""
    return swiglu_oai(x, alpha, limit)
