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
input layers' normalised output rides beside the stream (Llama's residual slot). Tensor
parallelism and FP8 are refused (`family_options`).
"""

from __future__ import annotations

import copy

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer


def l2(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x²) + eps) over the last dim, in float32, rounded to x's dtype."""
    f = x.float()
    return (f * torch.rsqrt(f.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


class DoryMLP:
    """down(l2(silu(gate) · up)), gate and up scaled per channel (module docstring)."""

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str, hidden: int) -> None:
        p = prefix + "mlp."
        self.gate_up = linear_layer(ctx, w, [p + "gate_proj.weight", p + "up_proj.weight"])
        self.down = linear_layer(ctx, w, [p + "down_proj.weight"])
        self.scale = torch.cat([w[p + "suv_gate"], w[p + "suv_up"]]) * hidden**0.5
        self.act_and_mul = ctx.act_and_mul

    def linears(self):
        return [self.gate_up, self.down]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(l2(self.act_and_mul(x=self.gate_up(x) * self.scale)))


class DoryLayer(LlamaLayer):
    """The layer of the module docstring; `loop_start` on the first recurrent layer of each
    loop's pass (set by `DoryModel`)."""

    loop_start = False

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        c, a = model.config, prefix + "self_attn."
        loops, d = c.family.dory, c.head_dim
        self.gate = linear_layer(ctx, w, [a + "gate_proj.weight"])
        sqk = (w[a + "sqk"] * (d**0.5 / loops.init_range)).square()
        self.q_scale = sqk.view(c.num_heads, d)
        self.s_gate = (w[a + "s_gate"] * (c.hidden_size**0.25 / loops.init_range)).square()
        rate = loops.alpha / loops.init_range
        self.rates = ((w[prefix + "lambda_1"] * rate).abs(), (w[prefix + "lambda_2"] * rate).abs())

    def linears(self):
        return [*super().linears(), self.gate]

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return l2(q), l2(k)

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q * self.q_scale, k

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return l2(out * torch.sigmoid(self.gate(x) * self.s_gate))

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
