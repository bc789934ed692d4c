"""Laguna (`LagunaForCausalLM`: poolside's Laguna), as transformers runs it (its config in
`laguna_config.py`, `model_configs.LagunaAttention`):

- Llama's layer (pre-norms, residual adds fused) with Qwen3's per-head q/k norms before rotary;
- query heads by layer (`num_attention_heads_per_layer`; KV heads and head size shared, so
  every layer shares the model's attention backend and KV-cache shape: the backend reads a
  layer's heads from its q);
- rotary by layer kind (`rope_parameters`): the full-attention layers' ("global": its base and
  `partial_rotary_factor`, the first dims of each head rotating), the sliding ones' ("local":
  their own base and fraction), window layers seeing `sliding_window` keys;
- attention's output gated before o_proj by softplus(g_proj(x)) in float32, rounded to the
  model's dtype: one gate per head (`gating` true / "per-head"), or per element;
- a dense MLP where `mlp_layer_types` says "dense", else experts picked by the sigmoid of the
  router's logits (`mlp.gate`) plus a choice-only bias (`mlp.experts.e_score_correction_bias`),
  weighted by the uncorrected scores renormalised, times `moe_routed_scaling_factor`
  (`moe_routing.GroupedRouter`), beside an ungated shared expert (`mlp.shared_expert.`).

Tensor parallel (`distributed/layout.py`): each layer's query heads split over the ranks (each
layer's count must divide), with their gates' rows; the KV heads split or replicated as the
model's; o row-parallel; the experts and the shared expert by width, the router replicated.
FP8 is refused (`engine/start_checks.check_dtype`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from pagoda.runtime.model import moe_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel, linear_layer
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import build_cos_sin_cache, check_rope_context
from pagoda.runtime.model.parallel_linear import column_linear
from pagoda.runtime.model.qwen3 import Qwen3Layer


class LagunaLayer(Qwen3Layer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        g = model.config.family.laguna
        self.heads = (0, g.heads[index]) if ctx.tp is None else ctx.tp.layout.heads(g.heads[index])
        ctx = dataclasses.replace(ctx, num_heads=self.heads[1] - self.heads[0])  # (this rank's)
        super().__init__(model, w, prefix, index, ctx)
        self.per_head = g.gate_per_head
        gate = [prefix + "self_attn.g_proj.weight"]
        if ctx.tp is None:
            self.gate = linear_layer(ctx, w, gate)
        else:  # this rank's heads' gates (one a head, or one per element)
            width = 1 if self.per_head else ctx.head_dim
            self.gate = column_linear(
                ctx, w, gate, [(self.heads[0] * width, self.heads[1] * width)]
            )

    def split_qkv(self, model: LlamaModel, w: DeviceWeights, names: list[str]):
        """This rank's share of this layer's query heads, and its KV heads (the model's)."""
        (q0, q1), d = self.heads, self.ctx.head_dim
        k0, k1 = self.ctx.tp.layout.kv_heads(model.config.num_kv_heads)
        return column_linear(
            self.ctx, w, names, [(q0 * d, q1 * d), (k0 * d, k1 * d), (k0 * d, k1 * d)]
        )

    def linears(self):
        return [*super().linears(), self.gate]

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        gate = F.softplus(self.gate(x).float()).to(out.dtype)
        if not self.per_head:
            return out * gate
        t, h = gate.shape
        return (out.view(t, h, -1) * gate.unsqueeze(-1)).view(t, -1)


_NAMES = moe_names.of("laguna")


class LagunaModel(LlamaModel):
    layer_class = LagunaLayer
    moe_names = (_NAMES.block, _NAMES.experts)
    moe_router, moe_bias, moe_shared = _NAMES.router, _NAMES.bias, _NAMES.shared
    make_mlp = make_mlp

    def rope_table(self, index: int) -> str:
        return "local" if self.config.family.window(index) is not None else "global"

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        """ "global": the full-attention layers' rotary; "local": the sliding layers' (module
        docstring)."""
        c, g = self.config, self.config.family.laguna
        check_rope_context(c.rope_scaling, c.max_position_embeddings, max_positions)
        local = {"partial_rotary_factor": g.local_rotary}
        caches = {
            "global": build_cos_sin_cache(c.head_dim, c.rope_theta, c.rope_scaling, max_positions),
            "local": build_cos_sin_cache(c.head_dim, g.local_rope_theta, local, max_positions),
        }
        return {name: cache.to(self.device) for name, cache in caches.items()}
