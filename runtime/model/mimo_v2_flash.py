"""MiMo-V2-Flash (`MiMoV2FlashForCausalLM`; its config in `mimo_v2_flash_config.py`,
`model_configs.MiMoAttention`): GLM-4.5's model (`glm4_moe.py`: DeepSeek-V3's grouped
sigmoid router and experts, here without a shared expert; dense MLPs where `mlp_layer_types`
says) with the attention of transformers' `MiMoV2FlashAttention`:

- the sliding-window layers have twice the KV heads of the full-attention ones (each shape its
  attention backend, `AttentionBackend.with_geometry`, and its KV-cache pages) and attention
  sinks (`self_attn.attention_sink_bias`: one logit per head in each softmax's denominator,
  the backends' ``sinks`` as gpt-oss's);
- q/k heads `head_dim` wide, values `v_head_dim` (narrower) times `attention_value_scale`; the
  backends take one head size, so values are padded with zeros to the keys' size before the
  cache and each head's output sliced back before o_proj (the V cache costs head_dim /
  v_head_dim of what it needs: 192 / 128 = 1.5x on the published model);
- a partial rotary (rotate-half over each head's first `partial_rotary_factor` dims), its base
  by layer kind: "global" (full attention) and "local" (sliding) tables.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.glm4_moe import Glm4MoeModel
from pagoda.runtime.model.llama import LayerContext, LlamaLayer
from pagoda.runtime.model.ops import build_cos_sin_cache, check_rope_context
from pagoda.runtime.model.parallel_linear import column_linear


class MiMoV2FlashLayer(LlamaLayer):
    def __init__(
        self, model: MiMoV2FlashModel, w: DeviceWeights, prefix: str, index: int,
        ctx: LayerContext,
    ) -> None:  # fmt: skip
        m = model.config.family.mimo
        backend = model.layer_backend(index)
        ctx = dataclasses.replace(ctx, backend=backend, num_kv_heads=backend.num_kv_heads)
        self.v_dim, self.v_scale = m.v_head_dim, m.v_scale
        super().__init__(model, w, prefix, index, ctx)
        sinks = prefix + "self_attn.attention_sink_bias"
        if self.window is not None:
            sinks = w[sinks].float()
            if ctx.tp is not None:  # this rank's heads' sinks (a copy: not the whole's view)
                sinks = sinks[slice(*ctx.tp.layout.heads(sinks.shape[0]))].clone()
            self.sinks = sinks.contiguous()

    def split_qkv(self, model, w: DeviceWeights, names: list[str]):
        """This rank's query heads and this layer's KV heads (split or replicated:
        `MiMoV2FlashModel.local_kv_heads`), values `v_head_dim` wide."""
        c, d, v = model.config, model.config.head_dim, self.v_dim
        (q0, q1), (k0, k1) = self.ctx.tp.layout.heads(c.num_heads), model.local_kv_heads(self.index)
        rows = [(q0 * d, q1 * d), (k0 * d, k1 * d), (k0 * v, k1 * v)]
        return column_linear(self.ctx, w, names, rows)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, heads, D], k [T, KV heads, D], v scaled and padded to D [T, KV heads, D]."""
        ctx = self.ctx
        t, d, h, hkv = x.shape[0], ctx.head_dim, ctx.num_heads, ctx.num_kv_heads
        q, k, v = self.qkv(x).split([h * d, hkv * d, hkv * self.v_dim], dim=-1)
        v = F.pad(v.reshape(t, hkv, self.v_dim) * self.v_scale, (0, d - self.v_dim))
        return q.reshape(t, h, d), k.reshape(t, hkv, d), v

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Each head's first `v_head_dim` dims (the rest: the padding's zeros)."""
        h = self.ctx.num_heads
        out = out.view(out.shape[0], h, -1)[..., : self.v_dim]
        return out.reshape(out.shape[0], h * self.v_dim)


class MiMoV2FlashModel(Glm4MoeModel):
    layer_class = MiMoV2FlashLayer

    def __init__(self, config, weights, **kwargs) -> None:
        self._backends: dict[tuple[int, int], AttentionBackend] = {}
        super().__init__(config, weights, **kwargs)

    def local_kv_heads(self, index: int) -> tuple[int, int]:
        """Layer `index`'s KV heads [start, stop) on this rank: all of them on one, else split
        or replicated by `layout.py` (the sliding layers have twice the full ones')."""
        kv = self.config.kv_layer_shapes[index][0]
        return (0, kv) if self.tp is None else self.tp.layout.kv_heads(kv)

    def layer_backend(self, index: int) -> AttentionBackend:
        k0, k1 = self.local_kv_heads(index)
        shape = (k1 - k0, self.config.head_dim)
        if shape not in self._backends:
            self._backends[shape] = self.backend.with_geometry(*shape)
        return self._backends[shape]

    @property
    def kv_backends(self) -> list[AttentionBackend]:
        return [self.layer_backend(i) for i in range(self.config.num_layers)]

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        """ "global" (full attention) and "local" (sliding) tables, both partial."""
        c, f = self.config, self.config.family
        check_rope_context(c.rope_scaling, c.max_position_embeddings, max_positions)
        caches = {
            "global": build_cos_sin_cache(c.head_dim, c.rope_theta, c.rope_scaling, max_positions),
            "local": build_cos_sin_cache(
                c.head_dim, f.local_rope_theta, c.rope_scaling, max_positions
            ),
        }
        return {name: cache.to(self.device) for name, cache in caches.items()}
