"""Gemma 4 (the text model: `Gemma4ForCausalLM`, and `Gemma4ForConditionalGeneration` read
text-only; its config in `gemma4_config.py`, `model_configs.Gemma4Layers`; Gemma 4 Unified's
too, which is this model without per-layer inputs or the MoE block): Gemma 3's scaled
embedding, four norms a layer, GeGLU and final soft cap (`gemma2.py`), with what transformers'
`Gemma4TextDecoderLayer` changes:

- RMSNorm scaling by w itself (not 1 + w), in float32, rounded once; q and k normed per head,
  and v too (without a weight); no softmax scale (1.0) and no attention soft cap;
- head size and KV heads by layer (the full-attention layers' own: each shape its attention
  backend, `AttentionBackend.with_geometry`, and its KV-cache pages); sliding layers rotate by
  their table ("local"), full-attention ones by the "proportional" one ("global": the first
  `partial_rotary_factor` of the angles over the whole head size, the rest 0, so those dims
  pass through as transformers' cos 1 / sin 0 leave them);
- `attention_k_eq_v`: values are the keys' projection (before the k norm) in the
  full-attention layers; KV-shared layers (`num_kv_shared_layers`) have q alone: they attend
  over the cache of the last earlier layer of their kind, with that layer's k/v of the step,
  storing nothing (the runner allocates them no pages: `LlamaModel.kv_backends`);
- the dense MLP, and with `enable_moe_block` beside it a router (an unweighted norm, x scale /
  sqrt(hidden), softmax, top-k renormalised, times a per-expert scale) over GeGLU experts fed
  the pre-MLP stream through their own norm: norm1(mlp) + norm2(experts), then the post-MLP norm;
- per-layer inputs: a table of `num_layers x hidden_size_per_layer_input` per token (scaled by
  sqrt of its width) averaged with a projection of the embedding (scaled, normed) by 1/sqrt(2);
  each layer then adds norm(proj(gelu(gate(h)) * its slice)) to the stream;
- each layer's output times its `layer_scalar`.

Each layer hands back the whole stream (the residual adds are not fused into the norms: the
layer scalar scales all of it). Experts: grouped on the CPU; on CUDA every expert over every
token (the fused-MoE kernel runs SwiGLU, these run GeGLU), no host sync. FP8 is refused
(`engine/start_checks.check_dtype`).

Tensor parallel (`distributed/layout.py`): each layer's query heads and its own KV heads (by its
shape: split, or replicated when fewer than ranks) column-parallel, o row-parallel; a KV-shared
layer reads its source's cache rows on its own rank (the same kind: the same heads); the MLP
(double wide or not) and each expert split by width, the experts' sum all-reduced before its
norm; the router, the per-layer inputs (table, projection, each layer's gate and projection),
norms and layer scalars replicated.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend
from pagoda.runtime.model import moe as moe_module
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gemma2 import Gemma2Model
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaLayer, Step, linear_layer
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.ops import build_cos_sin_cache, gemma_rms_norm, rotary_embedding
from pagoda.runtime.model.parallel_linear import column_linear, row_linear


@dataclass
class Gemma4Step(Step):
    per_layer: torch.Tensor | None = None  # [T, layers, hidden_size_per_layer_input]
    # this step's (k, v) of each layer a KV-shared layer reads, by layer
    shared_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class Gemma4Router:
    """(weights float32 [T, k], ids [T, k]) of the pre-MLP stream (module docstring)."""

    def __init__(self, model: Gemma4Model, w: DeviceWeights, p: str, ctx: LayerContext) -> None:
        g = model.config.family.gemma4
        self.linear = linear_layer(ctx, w, [p + "proj.weight"])
        self.scale, self.per_expert = w[p + "scale"], w[p + "per_expert_scale"]
        self.ones, self.ctx, self.top_k = model.ones(model.config.hidden_size), ctx, g.top_k
        self.root = model.config.hidden_size**-0.5

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.ctx.rms_norm(x=x, weight=self.ones, eps=self.ctx.eps)
        probs = torch.softmax(self.linear(x * self.scale * self.root), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert[ids], ids


def _experts(model: Gemma4Model, w: DeviceWeights, p: str, ctx: LayerContext) -> SparseMoE:
    """The layer's GeGLU experts (gate_up [E, 2N, K], down [E, K, N]) behind its router (on
    every rank); tensor parallel: this rank's rows of each expert's gate and up, those columns
    of its down (`layout.py`), the output summed over ranks (`Gemma4Layer.routed_experts`)."""
    gate_up, down = w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"]
    if ctx.tp is not None:
        n = gate_up.shape[1] // 2
        a, b = ctx.tp.layout.even(n)
        gate_up = torch.cat([gate_up[:, a:b], gate_up[:, n + a : n + b]], dim=1)
        down = down[:, :, a:b].contiguous()
    route = Gemma4Router(model, w, p + "router.", ctx)
    if w.device.type == "cuda":  # every expert over every token (module docstring)
        moe = SparseMoE(ctx, None, [], gate_up, down, route.top_k, False, False, route)
        moe.fused = None
        return moe
    pairs = [(ctx.linear(gate_up[e]), ctx.linear(down[e])) for e in range(gate_up.shape[0])]
    return SparseMoE(ctx, None, pairs, None, None, route.top_k, False, False, route)


class Gemma4Layer(LlamaLayer):
    def __init__(
        self, model: Gemma4Model, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        g = model.config.family.gemma4
        self.read_attention(model, w, prefix, index, ctx)
        ctx = self.ctx
        self.mlp = GatedMLP(ctx, w, prefix + "mlp.")
        self.moe = None
        if g.num_experts:
            self.moe = _experts(model, w, prefix, ctx)
            self.moe_norms = [model.read_norm(w, f"{prefix}{n}.weight") for n in _MOE_NORMS]
        self.per_layer = None
        self.act = _ACTS[model.config.family.hidden_act]  # (the MLP's: `hidden_activation`)
        if g.per_layer_input:
            self.per_layer = (
                linear_layer(ctx, w, [prefix + "per_layer_input_gate.weight"]),
                linear_layer(ctx, w, [prefix + "per_layer_projection.weight"]),
                model.read_norm(w, prefix + "post_per_layer_input_norm.weight"),
            )
        self.layer_scalar = w[prefix + "layer_scalar"]

    def read_attention(
        self, model: Gemma4Model, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        """The attention (its own shape, or a KV-shared layer's q alone) and the four norms
        around it and the MLP (Gemma 3n's layer reads them too: `gemma3n.py`)."""
        g, a = model.config.family.gemma4, prefix + "self_attn."
        backend, d = model.layer_backend(index), g.head_dims[index]
        (k0, k1) = model.local_kv_heads(index)
        ctx = dataclasses.replace(ctx, backend=backend, head_dim=d, num_kv_heads=k1 - k0)
        self.ctx, self.index, self.source = ctx, index, g.kv_source[index]
        self.shared, self.k_eq_v = g.shares_kv(index), g.k_eq_v[index]
        names = [a + "q_proj.weight"]
        if not self.shared:
            names += [a + "k_proj.weight"] + ([] if self.k_eq_v else [a + "v_proj.weight"])
        o = a + "o_proj.weight"
        if ctx.tp is None:
            self.qkv, self.o_proj = linear_layer(ctx, w, names), linear_layer(ctx, w, [o])
        else:  # this rank's query heads and KV heads of this layer's shape (`local_kv_heads`)
            q0, q1 = ctx.tp.layout.heads(model.config.num_heads)
            rows = [(q0 * d, q1 * d)] + [(k0 * d, k1 * d)] * (len(names) - 1)
            self.qkv, self.o_proj = column_linear(ctx, w, names, rows), row_linear(ctx, w, o)
        self.q_norm = model.read_norm(w, a + "q_norm.weight")
        self.k_norm = None if self.shared else model.read_norm(w, a + "k_norm.weight")
        self.v_norm = model.ones(ctx.head_dim)
        norm = {n: model.read_norm(w, f"{prefix}{n}.weight") for n in _NORMS}
        self.attn_norm, self.post_attn_norm = (
            norm["input_layernorm"],
            norm["post_attention_layernorm"],
        )
        self.pre_mlp_norm, self.post_mlp_norm = (
            norm["pre_feedforward_layernorm"],
            norm["post_feedforward_layernorm"],
        )
        self.window = model.config.family.window(index)
        self.chunk = None
        # an FP8 cache's scales: the reading layer's own, or those the cache was written with
        self.kv_scales = model.kv_scales(w, f"model.layers.{self.source}.self_attn")
        self.rope = model.rope_table(index)
        self.rotary = ctx.ops.rotary_embedding

    def linears(self):
        out = [self.qkv, self.o_proj, *self.mlp.linears()]
        out += [] if self.moe is None else self.moe.linears()
        return out + ([] if self.per_layer is None else list(self.per_layer[:2]))

    def __call__(self, h: torch.Tensor, residual: None, step: Gemma4Step):
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        x = norm(x=h, weight=self.attn_norm, eps=eps)
        h = h + norm(x=self.attention(x, step), weight=self.post_attn_norm, eps=eps)
        y = self.mlp(norm(x=h, weight=self.pre_mlp_norm, eps=eps))
        if self.moe is not None:  # beside the MLP, off the same stream (module docstring)
            first, second_in, second_out = self.moe_norms
            experts = self.routed_experts(h, second_in)
            y = norm(x=y, weight=first, eps=eps) + norm(x=experts, weight=second_out, eps=eps)
        h = h + norm(x=y, weight=self.post_mlp_norm, eps=eps)
        if self.per_layer is not None:
            gate, proj, post = self.per_layer
            x = self.act(gate(h)) * step.per_layer[:, self.index]
            h = h + norm(x=proj(x), weight=post, eps=eps)
        return h * self.layer_scalar, None

    def routed_experts(self, h: torch.Tensor, norm_in: torch.Tensor) -> torch.Tensor:
        """The experts' output: routed by the stream `h`, fed it normed by `norm_in`."""
        moe = self.moe
        weights, ids = moe.route(h)
        x = self.ctx.rms_norm(x=h, weight=norm_in, eps=self.ctx.eps)
        if moe.w13 is not None:
            out = moe._every_expert(x, weights, ids)
        else:
            out = moe_module.grouped_experts(x, weights, ids, moe._expert)
        return out if moe.tp is None else moe.tp.all_reduce(out)  # (this rank's widths' part)

    def _heads(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Each head's row of `x` [T, H, D] normed on its own."""
        out = self.ctx.rms_norm(x=x.reshape(-1, x.shape[-1]), weight=weight, eps=self.ctx.eps)
        return out.view(x.shape)

    def attention(self, x: torch.Tensor, step: Gemma4Step) -> torch.Tensor:
        ctx = self.ctx
        t, d, h, hkv = x.shape[0], ctx.head_dim, ctx.num_heads, ctx.num_kv_heads
        qkv = self.qkv(x)
        q = self._heads(qkv[:, : h * d].view(t, h, d), self.q_norm)
        positions, rows = step.rope[self.rope]
        if self.shared:  # the producer's k/v of this step; its cache (`layer_caches`)
            k, v = step.shared_kv[self.source]
            rotary_embedding(positions=positions, q=q, k=q[:, :0], cos_sin_cache=rows)
        else:
            k = qkv[:, h * d : (h + hkv) * d].view(t, hkv, d)
            v = k if self.k_eq_v else qkv[:, (h + hkv) * d :].view(t, hkv, d)
            v = self._heads(v, self.v_norm)
            k = self._heads(k, self.k_norm)
            q, k = self.rotary(positions=positions, q=q, k=k, cos_sin_cache=rows)
            step.shared_kv[self.index] = (k, v)
        k_cache, v_cache = step.kv_caches[self.index]
        out = ctx.backend.forward(
            q, k, v, k_cache, v_cache, step.meta, window=self.window, kv_scales=self.kv_scales,
            store=not self.shared,
        )  # fmt: skip
        return self.o_proj(out.reshape(t, h * d))


_ACTS = {"silu": F.silu, "gelu": F.gelu,
         "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}  # fmt: skip
_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm")  # fmt: skip
_MOE_NORMS = ("post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
              "post_feedforward_layernorm_2")  # fmt: skip


class Gemma4Model(Gemma2Model):
    layer_class = Gemma4Layer
    rms_norm_16bit = staticmethod(gemma_rms_norm)  # (w in float32: `norm_weight`)

    def __init__(self, config, weights, **kwargs) -> None:
        self._backends: dict[tuple[int, int], AttentionBackend] = {}
        super().__init__(config, weights, **kwargs)

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """w itself (Gemma 4's norms scale by w), in float32 for `gemma_rms_norm`."""
        return weight.float() if self.dtype != torch.float32 else weight

    def ones(self, width: int) -> torch.Tensor:
        """An unweighted norm's weight."""
        return self.norm_weight(torch.ones(width, dtype=self.dtype, device=self.device))

    def local_kv_heads(self, index: int) -> tuple[int, int]:
        """Layer `index`'s KV heads [start, stop) on this rank: all of them on one, else split
        or replicated by `layout.py` (a KV-shared layer's are its source's: same kind, same
        count, so the same rows of the cache it reads)."""
        kv = self.config.family.gemma4.kv_heads[index]
        return (0, kv) if self.tp is None else self.tp.layout.kv_heads(kv)

    def layer_backend(self, index: int) -> AttentionBackend:
        g = self.config.family.gemma4
        k0, k1 = self.local_kv_heads(index)
        shape = (k1 - k0, g.head_dims[index])
        if shape not in self._backends:
            self._backends[shape] = self.backend.with_geometry(*shape)
        return self._backends[shape]

    @property
    def kv_backends(self) -> list[AttentionBackend]:
        g = self.config.family.gemma4
        return [self.layer_backend(i) for i in range(self.config.num_layers) if not g.shares_kv(i)]

    def layer_caches(self, caches: list) -> list:
        g, own, out = self.config.family.gemma4, iter(caches), []
        for i in range(self.config.num_layers):
            out.append(out[g.kv_source[i]] if g.shares_kv(i) else next(own))
        return out

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        g = self.config.family.gemma4
        self.per_layer_table = None
        if not g.per_layer_input:
            return
        self.per_layer_table = w["model.embed_tokens_per_layer.weight"]
        scale = torch.tensor(math.sqrt(g.per_layer_input), dtype=torch.float32)
        self.per_layer_scale = scale.to(device=self.device, dtype=self.dtype)
        self.per_layer_proj = linear_layer(ctx, w, ["model.per_layer_model_projection.weight"])
        self.per_layer_norm = self.read_norm(w, "model.per_layer_projection_norm.weight")

    def rope_table(self, index: int) -> str:
        return "local" if self.config.family.window(index) is not None else "global"

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        """ "local": the sliding layers' default rotary over their head size; "global": the
        full-attention layers' proportional one (module docstring)."""
        c, g = self.config, self.config.family.gemma4
        caches = {"local": build_cos_sin_cache(c.head_dim, c.rope_theta, None, max_positions)}
        full = [i for i in range(c.num_layers) if c.family.window(i) is None]
        d = g.head_dims[full[0]]
        angles = int(g.global_rotary * d // 2)
        inv = 1.0 / (g.global_rope_theta ** (torch.arange(0, 2 * angles, 2).float() / d))
        inv = torch.cat([inv, torch.zeros(d // 2 - angles)]) / g.global_rope_factor
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
        caches["global"] = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        return {name: cache.to(self.device) for name, cache in caches.items()}

    def per_layer_inputs(self, input_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
        """[T, layers, width]: the tokens' rows of the per-layer table with the embedding's
        projection (module docstring), as `Gemma4TextModel.project_per_layer_inputs`."""
        if self.per_layer_table is None:
            return None
        g, t, n = self.config.family.gemma4, h.shape[0], self.config.num_layers
        rows = F.embedding(input_ids, self.per_layer_table) * self.per_layer_scale
        proj = self.per_layer_proj(h) * self.config.hidden_size**-0.5
        proj = self.rms_norm(x=proj.reshape(-1, g.per_layer_input), weight=self.per_layer_norm,
                             eps=self.config.rms_norm_eps)  # fmt: skip
        return (proj.view(t, n, -1) + rows.view(t, n, -1)) * 2.0**-0.5

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        h = self.embed_tokens(input_ids)
        step = Gemma4Step(meta, kv_caches, self._rope_rows(positions, h.dtype, meta),
                          per_layer=self.per_layer_inputs(input_ids, h))  # fmt: skip
        for layer in self.layers:
            h, _ = layer(h, None, step)
        h = h.index_select(0, logits_indices)
        return self.logits(self.final_hidden(h, None), head)

    def final_hidden(self, h: torch.Tensor, residual: None) -> torch.Tensor:
        return self.rms_norm(x=h, weight=self.norm, eps=self.config.rms_norm_eps)
