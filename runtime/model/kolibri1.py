"""Kolibri 1 (`Kolibri1ForCausalLM`; its config in `kolibri1_config.py`): GLM-4.5's model
(`glm4_moe.Glm4MoeModel`: DeepSeek's routed experts beside the ungated shared ones; the router
`moe_routing.GroupedRouter` with the bias on the logits) with GLM-4's layer (`glm4.Glm4Layer`:
norms on attention's and the MLP's outputs) and Qwen3's per-head q/k norms (`qwen3.Qwen3Layer`);
the window layers rotate, the full ones are NoPE (`FamilyConfig.rope_layers`).

Kolibri 1.1 (`Kolibri11Model`; `kolibri1_config.py`): its indexed layers (Kolibri 1's full ones)
round their keys and values to NVFP4 before the cache (`nvfp4_round`) and attend to every key
(Pagoda serves it up to the indexer's budget: `Kolibri11`); a KV-shared layer has q_proj and
q_norm alone and reads its source layer's cache (`layer_caches`) and this step's keys and values
(handed on by the source layer, `step_kv`) without writing; dense MLPs in `mlp_only_layers`."""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.glm4 import Glm4Layer
from pagoda.runtime.model.glm4_moe import Glm4MoeModel
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step
from pagoda.runtime.model.qwen3 import Qwen3Layer


def nvfp4_round(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded to NVFP4 and back, as transformers' `nvfp4_fake_quantize`: per 16 values of
    the last dim an E4M3 scale (amax / 6), E2M1 magnitudes (steps 0.5 / 1 / 2 below 2 / 4 / 6),
    rounded to nearest-even."""
    blocks = x.float().unflatten(-1, (-1, 16))
    scale = (blocks.abs().amax(-1, keepdim=True) / 6).clamp(2**-9, 448)
    scale = scale.to(torch.float8_e4m3fn).float()
    scaled = blocks / scale
    magnitude = scaled.abs().clamp(max=6)
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    rounded = torch.round(magnitude / step) * step
    return (rounded.copysign(scaled) * scale).flatten(-2).to(x.dtype)


# the published tensor names -> the ones the model reads (transformers' conversion mapping)
_RENAMES = (
    (".moe.router.expert_bias", ".mlp.gate.e_score_correction_bias"),
    (".post_attn_norm.weight", ".post_self_attn_layernorm.weight"),
    (".post_ffn_norm.weight", ".post_mlp_layernorm.weight"),
)


class Kolibri1Layer(Glm4Layer, Qwen3Layer):
    """GLM-4's `__call__` and post-sublayer norms, Qwen3's q/k norms before rotary."""


class Kolibri1Model(Glm4MoeModel):
    layer_class = Kolibri1Layer


class Kolibri11Layer(Glm4Layer):
    """GLM-4's layer with Qwen3's q/k norms (the k norm and k/v projections: its own layers'),
    NVFP4 keys and values on the indexed layers, or a KV-shared layer's attention."""

    # a source layer's keys and values of this step (NVFP4), what its KV-shared layers read
    step_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    source: Kolibri11Layer | None = None  # a KV-shared layer's source (`Kolibri11Model`)

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        k = model.config.family.kolibri11
        self.shared = k.shares_kv(index)
        super().__init__(model, w, prefix, index, ctx)
        a = prefix + "self_attn."
        self.q_norm = model.norm_weight(w[a + "q_norm.weight"])
        self.k_norm = None if self.shared else model.norm_weight(w[a + "k_norm.weight"])
        self.indexed = model.config.family.window(index) is None  # (no window: indexed)
        # an FP8 cache's scales: those it was written with (the source layer's)
        self.kv_scales = model.kv_scales(w, f"model.layers.{k.kv_source[index]}.self_attn")

    def projections(self, model: LlamaModel, index: int) -> tuple[str, ...]:
        return ("q_proj",) if self.shared else super().projections(model, index)

    before_rotary = Qwen3Layer.before_rotary  # each head's q and k normed on its own

    def step_qkv(self, x: torch.Tensor, step: Step):
        q, k, v = self.qkv_heads(x)
        if self.indexed:
            v = nvfp4_round(v)
            self.step_kv = (k, v)  # (k rounded in `after_rotary`)
        return q, k, v

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.indexed:
            return q, k
        k = nvfp4_round(k)
        self.step_kv = (k, self.step_kv[1])
        return q, k

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        if not self.shared:
            return super().attention(x, step)
        ctx = self.ctx
        t, d, h = x.shape[0], ctx.head_dim, ctx.num_heads
        norm, eps = ctx.rms_norm, ctx.eps
        q = norm(x=self.qkv(x).view(t * h, d), weight=self.q_norm, eps=eps).view(t, h, d)
        k, v = self.source.step_kv
        k_cache, v_cache = step.kv_caches[self.index]  # (the source's: `layer_caches`)
        out = ctx.backend.forward(
            q, k, v, k_cache, v_cache, step.meta, window=None, kv_scales=self.kv_scales,
            store=False,
        )  # fmt: skip
        return self.o_proj(out.reshape(t, h * d))


class Kolibri11Model(Kolibri1Model):
    layer_class = Kolibri11Layer

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        sources = config.family.kolibri11.kv_source
        for i, layer in enumerate(self.layers):
            if layer.shared:
                layer.source = self.layers[sources[i]]

    def layer_caches(self, caches: list) -> list:
        """Each layer's (k_cache, v_cache): its own, or its source layer's."""
        sources, own, out = self.config.family.kolibri11.kv_source, iter(caches), []
        for i, s in enumerate(sources):
            out.append(out[s] if s != i else next(own))
        return out
