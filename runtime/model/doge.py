"""Doge (`DogeForCausalLM`, SmallDoge's; config read in `doge_config.py`,
`model_configs.DogeAttention`): Qwen3's layer (per-head q/k RMSNorms before rotary) with

- dynamic mask attention: each key's score gains a bias of its own, b = exp(A *
  softplus(dt_proj(v))) over every KV head's values of that token (one bias per KV head), as
  transformers adds it to the causal mask. The backends take no per-key bias, so it rides in
  the cache: q gains a column of ones and k the column b / scale (scale * q.k + b exactly),
  both padded with v to a multiple of 16 (`DogeAttention.cache_head_dim`: the cache and the
  attention kernels cost (D + 16) / D, 1.125x at the published head size 128), each head's
  output sliced back before o_proj. transformers keeps only the `keep_window_size` most biased
  keys of a longer context: the context is bounded by it instead (`ModelConfig.context_length`;
  2048 published, as the models' max_position_embeddings);
- learned residual scales: x = input_residual * x + attention(norm(x)), then
  x = post_attention_residual * x + mlp(norm(x));
- with `is_moe`, the cross-domain MoE: the dense MLP plus product-key experts, each a row of
  `down_embed` and of `up_embed`: the router's 2 * sqrt(E) logits are two halves of keys, an
  expert a pair (i, j) scored x_i + y_j, the top `num_experts_per_tok` of them softmaxed, and
  the output sum_e w_e * silu(down_e . x) * up_e. transformers' full forward reshapes the
  router's logits across tokens (its own note: not causal); its one-token forward, which this
  runs for every token (prefill included), splits each token's logits in halves.

Tensor parallel as Qwen3's, each rank its query and KV heads: the dynamic mask's dt_proj reads
every KV head's values, so a rank multiplies its heads' values by those input columns of it
and the partial [T, KV heads] are summed over the ranks (one all-reduce a layer; a replicated
KV head counted once: its other holders' columns are zeros), then each rank takes its heads'
biases (and A). The cross-domain MoE's dense MLP by width; its router and product-key tables
replicated (each rank computes every expert's sum). FP8 and quantized KV caches are refused
(`family_options`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import GatedMLP, LayerContext, Step, linear_layer
from pagoda.runtime.model.qwen3 import Qwen3Layer, Qwen3Model
from pagoda.runtime.model_configs import DogeAttention


class CrossDomainMoE:
    """The dense MLP plus the product-key experts (module docstring), batched over tokens."""

    __slots__ = ("dense", "doge", "down_embed", "router", "up_embed")

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str, doge: DogeAttention):
        self.dense = GatedMLP(ctx, w, prefix)
        self.router = linear_layer(ctx, w, [prefix + "router_gate.weight"])
        self.down_embed = w[prefix + "down_embed.weight"]  # [E, hidden]
        self.up_embed = w[prefix + "up_embed.weight"]
        self.doge = doge

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        t, g = x.shape[0], self.doge
        keys = g.num_keys
        top = self.router(x).view(t, 2, keys).topk(keys, dim=-1)  # each half sorted
        (sx, sy), (ix, iy) = top.values.unbind(1), top.indices.unbind(1)
        scores = (sx.unsqueeze(-1) + sy.unsqueeze(-2)).view(t, -1)
        experts = (ix.unsqueeze(-1) * keys + iy.unsqueeze(-2)).view(t, -1)
        scores, picked = scores.topk(g.top_k, dim=-1)
        experts = experts.gather(-1, picked)
        weights = F.softmax(scores, dim=-1)
        if g.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        down = F.embedding(experts, self.down_embed)  # [T, k, hidden]
        up = F.embedding(experts, self.up_embed)
        act = F.silu(torch.matmul(down, x.view(t, -1, 1)).view(t, -1)) * weights
        return self.dense(x) + torch.matmul(act.view(t, 1, -1), up).view(t, -1)

    def linears(self):
        return [*self.dense.linears(), self.router]


def _dynamic_mask(ctx: LayerContext, w: DeviceWeights, a: str, kv_heads: int):
    """(A, dt_proj, this rank's KV heads [start, stop)): A of those heads; dt_proj whole, or on
    a tensor-parallel rank its heads' input columns (zeros where another rank holds the same
    replicated head first: its partial sum is counted once)."""
    name = a + "dt_proj.weight"
    if ctx.tp is None:
        return w[a + "A"], linear_layer(ctx, w, [name]), (0, kv_heads)
    lay, d = ctx.tp.layout, w.length(name, 1) // kv_heads
    k0, k1 = lay.kv_heads(kv_heads)
    cols = w.part(name, 1, k0 * d, k1 * d)
    if kv_heads < lay.size and lay.rank != k0 * lay.size // kv_heads:  # (not its first holder)
        cols = torch.zeros_like(cols)
    return w.part(a + "A", 0, k0, k1), ctx.linear(cols), (k0, k1)


class DogeLayer(Qwen3Layer):
    def __init__(
        self, model: DogeModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        a = prefix + "self_attn."
        self.A, self.dt_proj, self.kv_range = _dynamic_mask(ctx, w, a, model.config.num_kv_heads)
        self.input_residual = w[prefix + "input_residual"]
        self.post_residual = w[prefix + "post_attention_residual"]
        self.backend: AttentionBackend = model.padded_backend

    def linears(self):
        return [*super().linears(), self.dt_proj]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The stream x = h + residual (the last layer's output, its residual scaled there)."""
        x, stream = self.attention_input(h, residual)
        out = self.attention(x, step)
        x, stream = self.ctx.rms_norm(x=out, weight=self.mlp_norm, eps=self.ctx.eps,
                                      residual=stream * self.input_residual)  # fmt: skip
        return self.mlp(x), stream * self.post_residual

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        ctx, backend = self.ctx, self.backend
        t, d, h = x.shape[0], ctx.head_dim, ctx.num_heads
        q, k, v = self.qkv_heads(x)
        q, k = self.before_rotary(q, k)
        positions, rows = step.rope[self.rope]
        q, k = self.rotary(positions=positions, q=q, k=k, cos_sin_cache=rows)
        dt = self.dt_proj(v.reshape(t, -1))  # [T, KV heads]: every head's (module docstring)
        if ctx.tp is not None:
            dt = ctx.tp.all_reduce(dt)[:, self.kv_range[0] : self.kv_range[1]]
        bias = torch.exp(self.A * F.softplus(dt))  # [T, this rank's KV heads]
        pad = (0, backend.head_dim - d)
        q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        q[..., d] = 1.0
        k[..., d] = bias / backend.scale
        k_cache, v_cache = step.kv_caches[self.index]
        out = backend.forward(q, k, v, k_cache, v_cache, step.meta)
        return self.o_proj(out[..., :d].reshape(t, h * d))


class DogeModel(Qwen3Model):
    layer_class = DogeLayer

    def __init__(self, config, weights, **kwargs) -> None:
        backend = kwargs["backend"]
        width = DogeAttention.cache_head_dim(config.head_dim)
        self.padded_backend = backend.with_geometry(backend.num_kv_heads, width)
        super().__init__(config, weights, **kwargs)

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        doge = self.config.family.doge
        if not doge.num_experts:
            return super().make_mlp(w, prefix, index, ctx)
        return CrossDomainMoE(ctx, w, prefix + "mlp.", doge)

    @property
    def kv_backends(self) -> list[AttentionBackend]:
        return [self.padded_backend] * self.config.num_layers
