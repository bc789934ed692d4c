"""Hunyuan V1 (`HunYuanDenseV1ForCausalLM`: Hunyuan-0.5B/1.8B/4B/7B; `HunYuanMoEV1ForCausalLM`:
Hunyuan-A13B), as transformers runs them: Llama's layer with an RMSNorm over each head of q and
of k **after** rotary (`self_attn.query_layernorm` / `key_layernorm`, one [head_dim] weight each);
the NTK-alpha rotary is a larger base (`hunyuan_config.rope`).

The MoE model has experts in every layer (`moe.SharedExpertMoE`): a float32 router
(`mlp.gate.wg`) whose softmax top-k is renormalised (`moe_routing.GroupedRouter`, greedy), the
experts and an ungated shared MLP (`mlp.shared_mlp`), all of `intermediate_size` as
transformers builds them.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model import moe_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.qwen3 import Qwen3Layer


class HunYuanLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        a = prefix + "self_attn."
        self.q_norm = model.norm_weight(w[a + "query_layernorm.weight"])  # [head_dim]
        self.k_norm = model.norm_weight(w[a + "key_layernorm.weight"])

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return Qwen3Layer.before_rotary(self, q, k)  # type: ignore[arg-type]  # (its per-head norms)


class HunYuanModel(LlamaModel):
    layer_class = HunYuanLayer


_NAMES = moe_names.of("hunyuan_v1_moe")


class HunYuanMoeModel(HunYuanModel):
    moe_names = (_NAMES.block, _NAMES.experts)
    moe_router = _NAMES.router
    moe_shared = _NAMES.shared
    make_mlp = make_mlp
