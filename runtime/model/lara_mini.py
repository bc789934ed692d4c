"""LaraMini (`LaraMiniForCausalLM`, Lara-4-Mini; config read in `qwen3_next_config.py`):
Qwen3-Next's config over three kinds of layer (`layer_types`, by default the released period
of five: DeltaNet, window, DeltaNet, full, window)

- Qwen3.5's Gated DeltaNet (`qwen3_next.GatedDeltaNet`), its projections stored fused as one
  `in_proj` (rows [q, k, v, z, b, a]: the order the mixer takes) and its gated norm as
  `out_norm`, scaled in float32 before the gate and rounded once (GLM-5-Next's);
- Qwen3's attention (`qwen3.Qwen3Layer`: per-head q/k norms, no output gate), rotating on the
  `sliding_attention` layers (the window: `FamilyConfig.window_layers`), NoPE on the
  `full_attention` ones (`FamilyConfig.rope_layers`);
- in every layer Flint's experts: the router's logits in float32 (`FamilyConfig.routing`:
  `moe_routing.GroupedRouter`, softmax, greedy), top-k renormalised where `norm_topk_prob`, the
  weights rounded to the model's dtype, the experts stacked (gate_up [E, 2N, hidden], down [E, hidden, N]) beside a shared expert added
  without a gate (`moe.SharedExpertMoE`).

Every RMSNorm scales by its weight as stored in float32 and rounds once (Helium's:
`ops.gemma_rms_norm`). Prefix caching as Qwen3-Next's; tensor parallelism by key heads
(`distributed/layout.py`); FP8 refused (`engine/start_checks.check_dtype`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.qwen3 import Qwen3Layer, Qwen3Model
from pagoda.runtime.model.qwen3_next import GatedDeltaNet
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig


class LaraGatedDeltaNet(GatedDeltaNet):
    """Qwen3.5's mixer under LaraMini's names, its gated norm in float32 (module docstring)."""

    norm_name, norm_rounded = "out_norm.weight", False

    def in_proj_weight(self, m: MambaConfig, w: DeviceWeights, p: str) -> torch.Tensor:
        return w[p + "in_proj.weight"]


class LaraMiniLayer(RecurrentLayer, Qwen3Layer):
    """Qwen3's attention layer, or a Gated DeltaNet layer, then the experts."""

    mixer: LaraGatedDeltaNet | None = None

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> LaraGatedDeltaNet:
        c = model.config
        return LaraGatedDeltaNet(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx)


class LaraMiniModel(Qwen3Model):
    """LaraMini (module docstring)."""

    layer_class = LaraMiniLayer
    rms_norm_16bit = staticmethod(gemma_rms_norm)
    moe_names = ("mlp.", ("gate_up_proj", "down_proj"))
    moe_shared = "shared_expert."  # (ungated: `FamilyConfig.routing` set)
    make_mlp = make_mlp
