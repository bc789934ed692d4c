"""Dory (`DoryForCausalLM`: a looped normalised transformer, nGPT; config and checkpoint names in
`dory_config.py`), as transformers runs it. Hidden states stay on the unit sphere: every norm is
a weightless L2 norm (`l2`), and a layer (Gemma 2's sandwich) interpolates towards each
normalised update at a learned per-channel rate instead of adding it:

    x = l2(h);  h = x + |λ1 s| (l2(attention(x)) - x);  x = l2(h);  h = x + |λ2 s| (l2(mlp(x)) - x)

Attention is AfMoE's: q and k L2-normalised per head, rotary by layer kind (the sliding layers'
own base), q × (sqk · sqrt(head_dim) / init_range)² per channel after rotary, the output ×
sigmoid(gate_proj(x) · (s_gate · hidden^¼ / init_range)²), L2-normalised, then o_proj. The MLP:
down(l2(silu(gate(x) · suv_gate · sqrt(hidden)) · up(x) · suv_up · sqrt(hidden))). The logits
× logit_scale / init_range per token.

The layers run in `DoryLoops.order`: the input layers, the recurrent ones `loops` times (each
pass starting from ``l2(h) + l2(h_in)``, h_in the input layers' output), the output layers. The
model's layer list is that order, the recurrent layers' objects repeated with their weights
shared, each entry its own KV cache index (a cache per loop, `ModelConfig.num_kv_layers`); the
input layers' normalised output rides beside the stream (Llama's residual slot). FP8 is
refused (`family_options`).

Tensor parallel as Llama's, each rank its heads (their rows of q/k/v and of the output gate,
their `sqk` and `s_gate`) and its rows of the MLP's gate and up (their `suv_*`); the two
whole-vector norms inside a layer (attention's gated output, the MLP's product) are L2 norms
over every rank's channels: each rank's sums of squares all-reduced (one [T, 1] each), then
o_proj and down row-parallel. The stream's norms are whole on every rank.
"""

from __future__ import annotations

import copy

import torch
from pagoda.runtime.distributed.group import TPGroup
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import (
    GatedMLP,
    LayerContext,
    LlamaLayer,
    LlamaModel,
    Step,
    linear_layer,
)
from pagoda.runtime.model.parallel_linear import column_linear


def l2(x: torch.Tensor, eps: float = 1e-6, tp: TPGroup | None = None) -> torch.Tensor:
    """x / sqrt(sum(x²) + eps) over the last dim, in float32, rounded to x's dtype; with `tp`,
    `x` is this rank's columns of the rows and the sum every rank's."""
    f = x.float()
    squares = f.pow(2).sum(-1, keepdim=True)
    return (f * torch.rsqrt((squares if tp is None else tp.all_reduce(squares)) + eps)).to(x.dtype)


def _rows(w: DeviceWeights, name: str, part: tuple[int, int] | None) -> torch.Tensor:
    """Vector `name`, whole or its elements [start, stop)."""
    return w[name] if part is None else w.part(name, 0, *part)


class DoryMLP(GatedMLP):
    """down(l2(silu(gate) · up)), gate and up scaled per channel (module docstring)."""

    __slots__ = ("scale", "tp")

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str, hidden: int) -> None:
        p = prefix + "mlp."
        super().__init__(ctx, w, p)  # (gate/up and down split as Llama's on ranks)
        part = None if ctx.tp is None else ctx.tp.layout.even(w.length(p + "suv_gate", 0))
        scales = [_rows(w, p + "suv_gate", part), _rows(w, p + "suv_up", part)]
        self.scale, self.tp = torch.cat(scales) * hidden**0.5, ctx.tp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(l2(self.act_and_mul(x=self.gate_up(x) * self.scale), tp=self.tp))


class DoryLayer(LlamaLayer):
    """The layer of the module docstring; `loop_start` on the first recurrent layer of each
    loop's pass (set by `DoryModel`)."""

    loop_start = False

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        c, a = model.config, prefix + "self_attn."
        loops, d, gate = c.family.dory, c.head_dim, [a + "gate_proj.weight"]
        heads = None if ctx.tp is None else ctx.tp.layout.heads(c.num_heads)
        part = None if heads is None else (heads[0] * d, heads[1] * d)  # (this rank's heads')
        self.gate = linear_layer(ctx, w, gate) if part is None else column_linear(ctx, w, gate)
        sqk = (_rows(w, a + "sqk", part) * (d**0.5 / loops.init_range)).square()
        self.q_scale = sqk.view(ctx.num_heads, d)
        s_gate = _rows(w, a + "s_gate", part)
        self.s_gate = (s_gate * (c.hidden_size**0.25 / loops.init_range)).square()
        rate = loops.alpha / loops.init_range
        self.rates = ((w[prefix + "lambda_1"] * rate).abs(), (w[prefix + "lambda_2"] * rate).abs())

    def linears(self):
        return [*super().linears(), self.gate]

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return l2(q), l2(k)

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q * self.q_scale, k

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return l2(out * torch.sigmoid(self.gate(x) * self.s_gate), tp=self.ctx.tp)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.loop_start:  # (`residual`: the input layers' output, normalised)
            residual = l2(h) if residual is None else residual
            h = l2(h) + residual
        x = l2(h)
        h = x + self.rates[0] * (l2(self.attention(x, step)) - x)
        x = l2(h)
        return x + self.rates[1] * (l2(self.mlp(x)) - x), residual


class DoryModel(LlamaModel):
    layer_class = DoryLayer

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        loops = config.family.dory
        starts = {loops.inputs + k * loops.recurrent for k in range(loops.loops)}
        layers = []
        for i, physical in enumerate(loops.order()):  # (the weights shared, a cache each)
            layer = copy.copy(self.layers[physical])
            layer.index, layer.loop_start = i, i in starts and loops.recurrent > 0
            layers.append(layer)
        self.layers = layers

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return DoryMLP(ctx, w, prefix, self.config.hidden_size)

    def read_norm(self, w: DeviceWeights, name: str):
        return None  # (weightless: `l2`)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        self.logit_scale = (
            w.source("lm_head.logit_scale").float() / self.config.family.dory.init_range
        )

    def head_blocks(self, w: DeviceWeights, head: str):
        return None  # (the logits scaled after the head)

    def linears(self):
        seen = {id(x): x for layer in self.layers for x in layer.linears()}
        return [*seen.values(), self.lm_head]

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        return l2(h)

    def logits(self, x, head):
        return self.lm_head(x).float() * self.logit_scale
