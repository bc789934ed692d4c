"""GLM-4.5 / GLM-4.6 (`Glm4MoeForCausalLM`; the config as `glm4_moe_config` reads it): the
Llama layer with GLM-4.5's differences.

- q/k/v biases (`ModelConfig.attention_bias`) and, with `use_qk_norm`, Qwen3's RMSNorm over
  each head of q and of k before rotary;
- a partial rotary in the rotate-half layout: the first `partial_rotary_factor x head_dim`
  dims of each head rotate as every other model's (`LlamaLayer.attention`), the rest pass;
- DeepSeek-V3's experts (`moe.make_mlp`): dense MLPs in the first `first_k_dense_replace`
  layers, then routed experts picked by `moe_routing.GroupedRouter` plus the ungated shared
  experts (`moe.SharedExpertMoE`), each split by width under tensor parallelism.

MiniCPM5-MoE (`MiniCPM5MoeForCausalLM`, `minicpm5_moe_config.py`) is this model with Llama's
attention (no q/k norms, the whole head rotating) gated as Qwen3-Next's (`qwen3.GatedQuery`:
q_proj gives each head's query and then its gate, attention's output times sigmoid(gate)).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model import moe_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.qwen3 import GatedQuery, Qwen3Layer


class Glm4MoeLayer(Qwen3Layer):
    """Qwen3's per-head q/k norms where the config has them (`use_qk_norm`), else none."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        if model.config.family.qk_norm:
            super().__init__(model, w, prefix, index, ctx)
        else:
            LlamaLayer.__init__(self, model, w, prefix, index, ctx)
            self.q_norm = self.k_norm = None

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (q, k) if self.q_norm is None else super().before_rotary(q, k)


class Glm4MoeModel(LlamaModel):
    """Also dots.llm1's, EXAONE MoE's, Solar Open's and Hy3's (`dots1_config.py`,
    `exaone_moe_config.py`, `solar_open_config.py`, `hy_v3_config.py`): their router,
    correction bias and shared experts where `moe_names` puts them."""

    layer_class = Glm4MoeLayer
    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    make_mlp = make_mlp

    @property
    def moe_bias(self) -> str:
        return moe_names.of(self.config.architecture).bias

    @property
    def moe_router(self) -> str:
        return moe_names.of(self.config.architecture).router

    @property
    def moe_shared(self) -> str:
        return moe_names.of(self.config.architecture).shared


class MiniCPM5MoeLayer(GatedQuery, LlamaLayer):
    """Llama's layer with Qwen3-Next's output gate in q_proj (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.read_gated_qkv(model, w, prefix, ctx)


class MiniCPM5MoeModel(Glm4MoeModel):
    layer_class = MiniCPM5MoeLayer
