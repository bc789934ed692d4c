"""Nemotron-H (`NemotronHForCausalLM`: Nemotron-H 4B/8B/47B/56B, NVIDIA-Nemotron-Nano-9B-v2):
a stack of single blocks, each ``x + mixer(norm(x))`` with one norm, the mixer per layer
(`recurrent_configs.MambaConfig`, read in `nemotron_h_config.py`):

- a Mamba2 mixer (`mamba2.Mamba2Mixer`; its SSM state kept in float32, as the model's
  `mamba_ssm_cache_dtype` says), or
- attention without rotary (softmax scale head_dim ** -0.5), or
- an ungated MLP, down(relu(up(x))²) (`ungated_mlp.UngatedMLP`), or
- a MoE block (`NemotronHMoE`, Nemotron 3): ReLU² experts routed by DeepSeek-V3's sigmoid
  router (`moe_routing.GroupedRouter`) beside a shared expert; with tensor parallelism both
  split by width (the latent projections whole on every rank).

The RMSNorm scales the float32 rows by the weight and rounds once (`ops.gemma_rms_norm` with
the weight in float32, as Gemma's and OLMo 2's). The checkpoint's `backbone.` names are read as
Llama's (`nemotron_h_config.nemotron_name`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import MAMBA_STEP, Mamba2Mixer
from pagoda.runtime.model.moe import grouped_experts, masked_experts
from pagoda.runtime.model.moe_routing import GroupedRouter
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.parallel_linear import RowParallelLinear, column_linear, row_linear
from pagoda.runtime.model.ungated_mlp import UngatedMLP, relu2


class NemotronHMoE:
    """experts(x) + shared(x): each token's `top_k` experts, down(relu(up(x))²) on the input
    (projected to `latent` and back where set), weighted by the router; the shared expert on
    the input itself. On the CPU grouped by expert (`moe.grouped_experts`: the counts read on
    the host); elsewhere every expert over every token, masked by its weights (no host sync)."""

    def __init__(self, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext):
        e = model.config.family.mamba.moe
        p = prefix + "mlp."
        gate = ctx.linear(w.source(p + "gate.weight").float())  # float32, as transformers'
        self.route = GroupedRouter(gate, w.source(p + "gate.e_score_correction_bias"),
                                   e.routing, e.top_k, e.norm_topk_prob)  # fmt: skip
        x = p + "experts."  # a GGUF's experts stacked [E, N, K] (read once, then sliced)
        stacked = (
            [w[f"{x}{n}_proj.weight"] for n in ("up", "down")]
            if x + "up_proj.weight" in w
            else None
        )
        self.experts = [_expert(ctx, w, x, i, stacked) for i in range(e.num_experts)]
        self.shared = UngatedMLP(ctx, w, p + "shared_experts.", "relu2")
        self.tp = ctx.tp  # the experts and shared expert split by width: one all-reduce
        if isinstance(self.shared.down, RowParallelLinear):
            self.shared.down = self.shared.down.inner  # (no bias: its partial sum joins theirs)
        self.latent = None  # the latent projections (Nemotron 3 Super's), where the config says
        if e.latent:
            self.latent = [linear_layer(ctx, w, [f"{p}fc{i}_latent_proj.weight"]) for i in (1, 2)]
        self.grouped = w.device.type == "cpu"

    def linears(self):
        pairs = [x for pair in self.experts for x in pair]
        return [self.route.linear, *pairs, *self.shared.linears(), *(self.latent or [])]

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        up, down = self.experts[e]
        return down(relu2(up(rows)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        h = x if self.latent is None else self.latent[0](x)
        if self.grouped:
            out = grouped_experts(h, weights, ids, self._expert)
        else:
            out = masked_experts(h, weights, ids, self._expert, len(self.experts))
        if self.latent is not None:  # (on the experts' sum: a projection of its own)
            out = self.latent[1](out if self.tp is None else self.tp.all_reduce(out))
            shared = self.shared(x)
            return out + (shared if self.tp is None else self.tp.all_reduce(shared))
        out = out + self.shared(x)
        return out if self.tp is None else self.tp.all_reduce(out)


def _expert(ctx: LayerContext, w: DeviceWeights, p: str, x: int, stacked=None):
    """Expert `x`'s up and down; with tensor parallelism this rank's rows of up and columns of
    down (its partial product, summed with the block's all-reduce). From a GGUF's `stacked`
    (up, down [E, N, K]: `experts.up_proj` / `experts.down_proj`): expert `x`'s slices."""
    if stacked is not None:
        up, down = stacked[0][x], stacked[1][x]
        if ctx.tp is not None:  # this rank's rows of up, those columns of down
            a, b = ctx.tp.layout.even(up.shape[0])
            up, down = up[a:b], down[:, a:b]
        return ctx.linear(up.contiguous()), ctx.linear(down.contiguous())
    up, down = f"{p}{x}.up_proj.weight", f"{p}{x}.down_proj.weight"
    if ctx.tp is None:
        return linear_layer(ctx, w, [up]), linear_layer(ctx, w, [down])
    return column_linear(ctx, w, [up]), row_linear(ctx, w, down).inner


class NemotronHLayer(LlamaLayer):
    """x + mixer(norm(x)): the residual add fused into the next layer's norm, as Llama's."""

    mixer: Mamba2Mixer | None = None

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c = model.config
        m = c.family.mamba
        self.attends = m.attention(index)
        if self.attends:
            super().__init__(model, w, prefix, index, ctx)  # no MLP (`make_mlp`), no rotary
            return
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp = model.make_mlp(w, prefix, index, ctx)
        if m.layers[index]:
            self.mixer = Mamba2Mixer(m, w, prefix, index, c.rms_norm_eps, ctx)

    def linears(self):
        if self.attends:
            return [self.qkv, self.o_proj]
        return self.mixer.linears() if self.mixer is not None else self.mlp.linears()

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)
        if self.attends:
            return self.attention(x, step), residual
        if self.mixer is not None:
            return self.mixer(x, step.meta.aux[MAMBA_STEP]), residual
        return self.mlp(x), residual


class NemotronHModel(LlamaModel):
    layer_class = NemotronHLayer
    rms_norm_16bit = staticmethod(gemma_rms_norm)  # the float32 rows scaled, then rounded

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.float() if self.dtype != torch.float32 else weight

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        m = self.config.family.mamba
        if m.moe is not None and m.moe.layers[index]:
            return NemotronHMoE(self, w, prefix, ctx)
        if not m.mlp_layers[index]:
            return None  # a Mamba or attention block: no MLP
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)


class Mamba2Model(LlamaModel):
    """Mamba2ForCausalLM (`mamba2_config.py`): Nemotron-H's Mamba blocks in every layer, each
    ``x + mixer(norm(x))``; Llama's RMSNorm (transformers' `Mamba2RMSNorm`)."""

    layer_class = NemotronHLayer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return None  # (every layer a Mamba block)
