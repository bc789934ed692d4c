"""Ergo (`ErgoForCausalLM`: Amazon's Ergo; config and checkpoint names in `ergo_config.py`), as
transformers runs it. The residual stream is float32 (so is the embedding table), and each
layer is

    s = gate_a(norm(attention(norm(s))), s);  s = gate_f(norm(mlp(norm(s))), s)

with four RMSNorms a layer (float32 weights, applied before rounding: `norm32`) and learned
residual gates ``gate(y, s) = sigmoid(w) y + sqrt(1 + sigmoid(w)) exp(-softplus(w) / 2) s``.
Attention: a fused q/k/v (split at read), per-head q/k RMSNorms, the sliding layers rotating
(interleaved pairs) over `sliding_window` keys, the full ones without rotary, their q and k ×
sqrt(`global_attention_scale`) where set. The MLP: dense ReLU² in the first layers; then
experts (`ErgoMoE`): ReLU², each expert's output RMS-normalised by its own weight, picked by
DeepSeek-V3's sigmoid router with a choice-only bias (`moe_routing.GroupedRouter`),
renormalised, × `moe_routed_scaling_factor`, the weights rounded to the model's dtype; plus the
shared expert's output, RMS-normalised. On the CPU the experts run grouped by expert
(`moe.grouped_experts`); elsewhere every expert over every token, masked by its weights (no
host sync; as Nemotron-H's: the fused-MoE kernel has no per-expert norm). FP8 is refused
(`family_options`).

Tensor parallel as Llama's attention (a rank's heads; o_proj all-reduced before its norm), the
dense and shared experts' MLPs by width (down all-reduced before the shared expert's norm),
and the routed experts **by expert** (each expert's output is normalised over the whole hidden
width, so an expert stays on one rank: rank r holds experts [r E/N, (r+1) E/N), N must divide
`num_experts`, `ergo_config.tp_problem`): each rank adds its experts' weighted, normed outputs
(its picks of other ranks' experts add nothing), one all-reduce of the sum; the router, the
norms and residual gates replicated, the float32 embedding table split by vocabulary rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import EMBED, LayerContext, LlamaLayer, LlamaModel, Step
from pagoda.runtime.model.moe import grouped_experts, masked_experts
from pagoda.runtime.model.moe_routing import GroupedRouter
from pagoda.runtime.model.parallel_linear import VocabParallelEmbedding
from pagoda.runtime.model.ungated_mlp import UngatedMLP, relu2


def norm32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ErgoRMSNorm: normalised and scaled in float32, rounded to x's dtype."""
    return F.rms_norm(x.float(), weight.shape, weight, eps).to(x.dtype)


def _gates(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the branch's, the stream's) factors of a residual gate's weight (module docstring)."""
    branch = torch.sigmoid(w)
    return branch, torch.sqrt(1.0 + branch) * torch.exp(-0.5 * F.softplus(w))


class ErgoMoE:
    """experts(x) + norm(shared(x)) (module docstring)."""

    def __init__(self, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext):
        f, p = model.config.family, prefix + "mlp."
        gate = w.source(p + "gate.weight").to(model.dtype).float()  # (rounded as transformers')
        self.route = GroupedRouter(ctx.linear(gate), w.source(p + "gate.e_score_correction_bias"),
                                   f.routing, f.num_experts_per_tok, f.norm_topk_prob)  # fmt: skip
        self.first, stop, self.tp = 0, f.num_experts, ctx.tp  # (this rank's experts)
        if ctx.tp is not None:
            self.first, stop = ctx.tp.layout.even(f.num_experts)
        up = w.part(p + "experts.up_proj", 0, self.first, stop)  # [E, h, I]
        down = w.part(p + "experts.down_proj", 0, self.first, stop)  # [E, I, h]
        self.experts = [(ctx.linear(u.t().contiguous()), ctx.linear(d.t().contiguous()))
                        for u, d in zip(up, down)]  # fmt: skip
        self.norms = w.source(p + "experts.norm").float()  # [E, h]
        if ctx.tp is not None:  # (its experts' rows alone, not a view of all)
            self.norms = self.norms[self.first : stop].clone()
        self.shared = UngatedMLP(ctx, w, p + "shared_experts.", "relu2")
        self.shared_norm = w.source(p + "shared_experts.norm.weight").float()
        self.eps, self.grouped = ctx.eps, w.device.type == "cpu"

    def linears(self):
        return [self.route.linear, *(x for pair in self.experts for x in pair),
                *self.shared.linears()]  # fmt: skip

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        up, down = self.experts[e]
        return norm32(down(relu2(up(rows))), self.norms[e], self.eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        weights = weights.to(x.dtype).float()
        if self.tp is not None:  # this rank's experts by their local index, the others' none
            ids = ids - self.first
            ids = ids.masked_fill((ids < 0) | (ids >= len(self.experts)), -1)
        if self.grouped:
            out = grouped_experts(x, weights, ids, self._expert)
        else:
            out = masked_experts(x, weights, ids, self._expert, len(self.experts))
        if self.tp is not None:
            out = self.tp.all_reduce(out)
        return out + norm32(self.shared(x), self.shared_norm, self.eps)


class ErgoLayer(LlamaLayer):
    """The layer of the module docstring; the float32 stream goes from layer to layer in `h`
    (no residual beside it)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        c, self.dtype = model.config, model.dtype
        self.attn_norm = self.mlp_norm = None  # (Llama's, as the model's dtype: `norms` here)

        def f32(name: str) -> torch.Tensor:
            return w.source(prefix + name).float()

        self.norms = [f32(n + ".weight") for n in ("input_layernorm", "post_attention_layernorm",
                                                   "pre_feedforward_layernorm",
                                                   "post_feedforward_layernorm")]  # fmt: skip
        self.q_norm, self.k_norm = f32("self_attn.q_norm.weight"), f32("self_attn.k_norm.weight")
        self.attn_gate = _gates(f32("attention_residual_gate.weight"))
        self.mlp_gate = _gates(f32("feedforward_residual_gate.weight"))
        scale = c.family.global_attention_scale
        full = self.window is None  # (the full-attention layers: no window, no rotary)
        self.qk_scale = None  # (rounded to the model's dtype, as transformers' buffer)
        if scale is not None and full:
            self.qk_scale = torch.tensor(scale**0.5).to(model.dtype).item()

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return norm32(q, self.q_norm, self.ctx.eps), norm32(k, self.k_norm, self.ctx.eps)

    def after_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.qk_scale is None:
            return q, k
        return q * self.qk_scale, k * self.qk_scale

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, None]:
        eps, dtype, n = self.ctx.eps, self.dtype, self.norms
        a = self.attention(norm32(h, n[0], eps).to(dtype), step)
        s = self.attn_gate[0] * norm32(a.float(), n[1], eps) + self.attn_gate[1] * h
        m = self.mlp(norm32(s, n[2], eps).to(dtype))
        return self.mlp_gate[0] * norm32(m.float(), n[3], eps) + self.mlp_gate[1] * s, None


class ErgoModel(LlamaModel):
    layer_class = ErgoLayer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if self.config.family.has_experts(index):
            return ErgoMoE(self, w, prefix, ctx)
        return UngatedMLP(ctx, w, prefix + "mlp.", "relu2")

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        self.norm = w.source("model.norm.weight").float()
        if ctx.tp is None:
            self.embed = w.source(EMBED).float()  # (a float32 table, as transformers keeps it)
            return
        split = self.embed  # (`vocab_parallel`'s: this rank's rows, zeros past the vocabulary)
        start, n = split.start, split.table.shape[0]
        rows = w.source(EMBED)[start : start + n].float()
        table = torch.zeros(n, rows.shape[1], dtype=torch.float32, device=split.table.device)
        table[: rows.shape[0]] = rows
        self.embed = VocabParallelEmbedding(table, start, ctx.tp)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The stream normalised in float32, rounded to the head's dtype."""
        return norm32(h, self.norm, self.config.rms_norm_eps).to(self.dtype)
