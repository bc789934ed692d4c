"""Flint (`FlintForCausalLM`: RecursiveSI/flint; its config read in `flint_config.py`): Qwen3-MoE's
model (`moe.Qwen3MoeModel`: per-head q/k norms, experts where `FamilyConfig.moe_layers` says, a
dense MLP elsewhere) with what transformers' Flint changes:

- gpt-oss's attention sinks (`self_attn.softmax_offset`, read as gpt-oss's `self_attn.sinks`:
  `gpt_oss.read_sinks`), one learned float32 logit per head in each softmax's denominator;
- rotary on the sliding-window layers only (`FamilyConfig.rope_layers`; the full-attention ones
  attend without positions);
- the router float32 (`mlp.gate.weight`), sigmoid scores without a bias, the top-k
  renormalised (`moe_routing.GroupedRouter`), beside an ungated `mlp.shared_expert`;
- gpt-oss's RMSNorm in 16 bits: w * norm(x) in float32, rounded once (`ops.gemma_rms_norm`).
"""

from __future__ import annotations

from pagoda.runtime.model import moe_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gpt_oss import read_sinks
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.moe import Qwen3MoeModel
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.qwen3 import Qwen3Layer


class FlintLayer(Qwen3Layer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.sinks = read_sinks(model, w, prefix, ctx)


class FlintModel(Qwen3MoeModel):
    layer_class = FlintLayer
    rms_norm_16bit = staticmethod(gemma_rms_norm)
    moe_shared = moe_names.of("flint").shared  # (ungated: the router is DeepSeek's kind)
