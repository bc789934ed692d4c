"""IBM Granite (3.x) and GraniteMoe: the Llama layer with four scalars from config.json.

- the token embeddings are multiplied by `embedding_multiplier`;
- each sublayer's output (attention's, the MLP's) by `residual_multiplier` before its residual
  add;
- the softmax scale is `attention_multiplier` (`FamilyConfig.attention_scale`; the attention
  backend reads it), not head_dim ** -0.5;
- the logits are divided by `logits_scaling`.

GraniteMoe puts Mixtral-style experts in every layer (`moe.SparseMoE`): the router
(`router.layer`) picks the top-k logits and softmaxes them (the renormalised top-k of a full
softmax), the weights rounded to the model's dtype; each layer's experts are stacked, gate and
up in one `input_linear` [E, 2N, K], down in `output_linear` [E, K, N]. A GGUF's come as llama.cpp's
converter splits them: gate, up and down stacked apart, under Mixtral's names (`gguf_loader`).
GraniteMoeShared (`GraniteMoeSharedForCausalLM`, read as `granitemoe`) adds beside the experts an
ungated `shared_mlp` of `shared_intermediate_size` (gate and up in one `input_linear`) that every
token goes through, its output added to the experts' before the residual multiplier.

GraniteSWA and GraniteMoeSWA (`GraniteSwaModel`, `GraniteMoeSwaModel`; their config in
`granite_swa_config.py`) are these two with window layers by `layer_types`, a sink logit per
head in every layer's softmax (`self_attn.sinks`, the backends' ``sinks`` as gpt-oss's) and a
rotary base per layer (`FamilyConfig.rope_thetas`: one table per base, none on a NoPE layer);
on tensor-parallel ranks each holds its heads' sinks.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gpt_oss import read_sinks
from pagoda.runtime.model.llama import (
    GatedMLP,
    LayerContext,
    LlamaLayer,
    LlamaModel,
    Step,
    linear_layer,
)
from pagoda.runtime.model.moe import MixtralModel, SharedExpertMoE, SparseMoE, make_mlp
from pagoda.runtime.model.ops import build_cos_sin_cache, check_rope_context
from pagoda.runtime.model.parallel_linear import RowParallelLinear, column_linear, row_linear


class SharedMLP(GatedMLP):
    """GraniteMoeShared's and Granite 4.0's `shared_mlp`: down(silu(gate(x)) * up(x)), gate and up stored as one
    `input_linear` [2I, hidden] (gate first), down as `output_linear`."""

    __slots__ = ()

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str) -> None:
        stacked, down = prefix + "input_linear.weight", prefix + "output_linear.weight"
        if ctx.tp is None:
            self.gate_up = linear_layer(ctx, w, [stacked])
            self.down = linear_layer(ctx, w, [down])
        else:  # this rank's rows of gate and of up (column-parallel), down row-parallel
            width = w.length(stacked, 0) // 2
            (a, b) = ctx.tp.layout.even(width)
            self.gate_up = column_linear(ctx, w, [stacked] * 2, [(a, b), (width + a, width + b)])
            self.down = row_linear(ctx, w, down)
        self.act_and_mul = ctx.act_and_mul


class GraniteLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.residual_multiplier = model.config.family.residual_multiplier

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.residual_multiplier
        x, residual = self.attention_input(h, residual)  # h: the last MLP's, already scaled
        h = self.attention(x, step) * scale
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        return self.mlp(x) * scale, residual


class GraniteModel(LlamaModel):
    layer_class = GraniteLayer

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().embed_tokens(input_ids) * self.config.family.embedding_multiplier

    def logits(self, x, head):
        scaling = self.config.family.logits_scaling
        if scaling == 1.0:
            return super().logits(x, head)
        return self.lm_head(x) / scaling


class HyperClovaxLayer(GraniteLayer):
    """Granite's layer with, where `use_post_norm` (`FamilyConfig.glm4_norms`), GLM-4's norms on
    attention's and the MLP's outputs (`post_norm1` / `post_norm2`, read under GLM-4's names)
    before their scaled residual adds."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.post_norms = None
        if model.config.family.glm4_norms:
            self.post_norms = tuple(model.norm_weight(w[f"{prefix}{n}.weight"])
                                    for n in ("post_self_attn_layernorm", "post_mlp_layernorm"))  # fmt: skip

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm, eps, scale, post = (
            self.ctx.rms_norm,
            self.ctx.eps,
            self.residual_multiplier,
            self.post_norms,
        )
        x, residual = self.attention_input(h, residual)  # h: the last MLP's, already scaled
        h = self.attention(x, step)
        if post is not None:
            h = norm(x=h, weight=post[0], eps=eps)
        x, residual = norm(x=h * scale, weight=self.mlp_norm, eps=eps, residual=residual)
        h = self.mlp(x)
        if post is not None:
            h = norm(x=h, weight=post[1], eps=eps)
        return h * scale, residual


class HyperClovaxModel(GraniteModel):
    """HyperCLOVA X (`HyperCLOVAXForCausalLM`): Granite's scalars with `HyperClovaxLayer`; the
    softmax scale head_dim ** -0.5 unless `attention_multiplier` says, and the logits multiplied
    by `logits_scaling` (`FamilyConfig.logit_scale`), not divided as Granite's."""

    layer_class = HyperClovaxLayer

    def logits(self, x, head):
        scale = self.config.family.logit_scale
        return super().logits(x, head) if scale == 1.0 else self.lm_head(x) * scale


class GraniteMoeModel(GraniteModel):
    moe_names = ("block_sparse_moe.", ("input_linear", "output_linear"))
    moe_router, moe_experts = "router.layer.weight", ""

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if prefix + "block_sparse_moe.input_linear.weight" not in w:  # a GGUF's (docstring)
            self.moe_names, self.moe_experts = MixtralModel.moe_names, "experts."
        if not self.config.family.shared_expert_intermediate_size:
            return make_mlp(self, w, prefix, index, ctx)
        shared = SharedMLP(ctx, w, prefix + "shared_mlp.")  # GraniteMoeShared's, ungated
        if isinstance(shared.down, RowParallelLinear):  # its partial sum joins the experts'
            shared.down = shared.down.inner  # (one all-reduce for both)
        return SharedExpertMoE(SparseMoE.from_weights(self, w, prefix, ctx), shared, None)


class GraniteSwaLayer(GraniteLayer):
    """Granite's layer with its heads' sink logits (float32), read as gpt-oss's (a rank's
    heads' with tensor parallelism)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.sinks = read_sinks(model, w, prefix, ctx)


class SwaRope:
    """GraniteSWA's rotary tables: "global" (`rope_theta`), and one per other base a layer
    names (`FamilyConfig.rope_thetas`), each with the config's scaling; a NoPE layer (base 0)
    reads none."""

    def rope_table(self, index: int) -> str | None:
        theta = self.config.family.rope_thetas[index]
        if not theta:
            return None
        return "global" if theta == self.config.rope_theta else f"theta={theta:g}"

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        c = self.config
        check_rope_context(c.rope_scaling, c.max_position_embeddings, max_positions)
        thetas = {c.rope_theta, *(t for t in c.family.rope_thetas if t)}
        caches = {}
        for theta in sorted(thetas):
            name = "global" if theta == c.rope_theta else f"theta={theta:g}"
            cache = build_cos_sin_cache(c.head_dim, theta, c.rope_scaling, max_positions)
            caches[name] = cache.to(self.device)
        return caches


class GraniteSwaModel(SwaRope, GraniteModel):
    layer_class = GraniteSwaLayer


class GraniteMoeSwaModel(SwaRope, GraniteMoeModel):
    layer_class = GraniteSwaLayer
