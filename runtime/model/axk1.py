"""A.X-K1 (`AXK1ForCausalLM`: skt/A.X-K1; its config read with DeepSeek's,
`deepseek_config.py`): DeepSeek-V3's model (`deepseek.DeepseekModel`: latent attention, always
with the q bottleneck, V3's grouped sigmoid router and the shared expert) with one change, as
transformers' `AXK1MoE`: an RMSNorm (`post_mlp_layernorm`, stored at the layer's level) on the
output of each MoE block, the shared expert's included, before the residual add. The dense
layers' copies of that norm (the releases store one) are not read, as transformers ignores
them; a checkpoint without the router's correction bias routes with none (zero: the
releases'; `ExpertRouting.bias_optional`)."""

from __future__ import annotations

import torch
from pagoda.runtime.model.deepseek import DeepseekModel
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.moe import make_mlp


class NormedMoE:
    """An MoE block whose output is RMS-normalised (after the ranks' sum under TP)."""

    __slots__ = ("eps", "moe", "norm", "weight")

    def __init__(self, moe, weight: torch.Tensor, ctx: LayerContext) -> None:
        self.moe, self.weight, self.norm, self.eps = moe, weight, ctx.rms_norm, ctx.eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x=self.moe(x), weight=self.weight, eps=self.eps)

    def linears(self) -> list[Linear]:
        return self.moe.linears()

    @property
    def routed(self):
        """The routed experts (where the fused-MoE kernel runs them)."""
        return getattr(self.moe, "routed", self.moe)


class AXK1Model(DeepseekModel):
    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        mlp = make_mlp(self, w, prefix, index, ctx)
        if not self.config.family.has_experts(index):
            return mlp
        return NormedMoE(mlp, self.read_norm(w, prefix + "post_mlp_layernorm.weight"), ctx)
