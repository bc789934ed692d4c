"""Llama 4's text model (`Llama4ForCausalLM`, `Llama4ForConditionalGeneration`'s language model:
Scout, Maverick; the config as `llama4_config` reads it): the Llama layer with Llama 4's
differences.

- rotary in the interleaved (complex) layout, pairs (2i, 2i + 1), computed in float32
  (`ops.rotary_interleaved`), on the layers `FamilyConfig.rope_layers` marks; after it, with
  `use_qk_norm`, q and k L2-normalised per head (a weightless RMSNorm in float32);
- the NoPE layers' q scaled by log1p(floor((position + 1) / floor_scale)) x attn_scale + 1
  (`attn_temperature_tuning`; the factor per position is one more table beside the rotary's,
  gathered with it);
- the MLP (`feed_forward`): dense, or (`moe_layers`) a router whose top-k logits' sigmoids
  each scale the token before their expert (transformers' `routed_in = x * score`: the
  expert's output is not weighted after; with k > 1 every pick runs on its own scaled row and
  the k outputs are summed), plus a shared expert every token goes through, ungated. The
  experts come stacked: `experts.gate_up_proj` [E, hidden, 2N] and `experts.down_proj`
  [E, N, hidden]; they run as every other family's (`moe.SparseMoE`'s grouped CPU path, the fused
  kernel on CUDA) with unit weights. A GGUF (llama.cpp's `llama4`) holds them as three stacks
  `experts.{gate,up,down}.weight`, [E, N, hidden] and [E, hidden, N]. Tensor parallelism splits the experts and the shared
  expert by width (their partial sums share one all-reduce), the router whole on every rank.
- chunked attention on the layers `FamilyConfig.chunk_layers` marks (the rotary ones): a token
  sees the keys of its own `attention_chunk_size` chunk only, masked by the attention backend
  (the layer passes its chunk as it would a sliding window); the NoPE layers see everything.
"""

from __future__ import annotations

import functools

import torch
from pagoda.runtime.cpu.quantized import stack
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaLayer, LlamaModel, Step
from pagoda.runtime.model.moe import SparseMoE, _ExpertTensors, grouped_experts
from pagoda.runtime.model.ops import rotary_interleaved
from pagoda.runtime.model.parallel_linear import RowParallelLinear

TEMPERATURE = "temperature"  # the rope table of the NoPE layers' q scales


class Llama4Layer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        extras = model.config.family.llama4
        self.rotary = functools.partial(rotary_interleaved, widen=True)  # float32, as HF's
        self.l2 = extras.qk_norm and self.rope is not None
        self.tuned = extras.temperature_tuning and self.rope is None

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        ctx = self.ctx
        t, d = x.shape[0], ctx.head_dim
        q, k, v = self.qkv_heads(x)
        if self.rope is not None:
            positions, rows = step.rope[self.rope]
            q, k = self.rotary(positions=positions, q=q, k=k, cos_sin_cache=rows)
            if self.l2:
                q, k = _l2_norm(q, ctx.eps), _l2_norm(k, ctx.eps)
        elif self.tuned:
            positions, rows = step.rope[TEMPERATURE]
            scale = rows if positions is None else rows.index_select(0, positions)
            q = (q * scale.unsqueeze(1)).to(q.dtype)  # [T, 1, 1]
        k_cache, v_cache = step.kv_caches[self.index]
        out = ctx.backend.forward(
            q, k, v, k_cache, v_cache, step.meta, window=None, kv_scales=self.kv_scales,
            chunk=self.chunk,
        )  # fmt: skip
        return self.o_proj(out.reshape(t, ctx.num_heads * d))


def _l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama4TextL2Norm: each head's row over its RMS, in float32, no weight."""
    f = x.float()
    return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Llama4Moe:
    """Router, stacked experts and shared expert of one layer (module docstring)."""

    def __init__(self, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext):
        f, p = model.config.family, prefix + "feed_forward."
        self.router = ctx.linear(w[p + "router.weight"])  # [E, hidden], replicated
        n = f.moe_intermediate_size
        rows = None if ctx.tp is None else ctx.tp.layout.even(n)  # this rank's width
        gates, ups, downs, blocks = _experts(w, p + "experts.", f.num_experts, n, rows)
        experts: list[tuple[Linear, Linear]] = []
        w13 = w2 = None
        if w.device.type == "cuda":  # stacked for the fused kernel: [E, 2N, K] and [E, K, N]
            w13 = torch.stack([torch.cat([g, u]) for g, u in zip(gates, ups)])
            w2 = torch.stack([x.contiguous() for x in downs])
        else:
            for g, u, dn, (qg, qu, qd) in zip(gates, ups, downs, blocks):
                gate_up_q = None if qg is None or qu is None else stack([*qg, *qu])
                experts.append((ctx.linear(torch.cat([g, u]), quantized=gate_up_q),
                                ctx.linear(dn.contiguous(), quantized=qd)))  # fmt: skip
        del gates, ups, downs
        self.experts = SparseMoE(ctx, None, experts, w13, w2, 1, False, False)  # type: ignore[arg-type]
        self.shared = GatedMLP(ctx, w, p + "shared_expert.")
        if isinstance(self.shared.down, RowParallelLinear):  # its partial sum joins the experts'
            self.shared.down = self.shared.down.inner
        self.tp = ctx.tp
        self.top_k = f.num_experts_per_tok

    def linears(self) -> list[Linear]:
        return [self.router, *(x for pair in self.experts.experts for x in pair),
                *self.shared.linears()]  # fmt: skip

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k = self.top_k
        top, ids = torch.topk(self.router(x), k, dim=-1)  # [T, k]
        score = torch.sigmoid(top.float()).to(x.dtype)
        # each pick's own row, its expert's input scaled by its score (transformers' routed_in):
        # [T * k, hidden], one expert a row, summed back per token after
        routed_in = (x.unsqueeze(1) * score.unsqueeze(-1)).reshape(-1, x.shape[-1])
        ids = ids.reshape(-1, 1)
        ones = torch.ones(ids.shape, dtype=torch.float32, device=x.device)
        s = self.experts
        if s.fused is not None:
            routed = s.fused(routed_in, s.w13, s.w2, ones, ids.to(torch.int32),
                             batch_invariant=s.batch_invariant)  # fmt: skip
        elif s.w13 is not None:
            routed = s._every_expert(routed_in, ones, ids)
        else:
            routed = grouped_experts(routed_in, ones, ids, s._expert)
        if k > 1:
            routed = routed.view(x.shape[0], k, -1).sum(1)
        out = self.shared(x) + routed
        return out if self.tp is None else self.tp.all_reduce(out)


def _experts(w: DeviceWeights, p: str, e: int, n: int, rows: tuple[int, int] | None):
    """(gates [N, hidden], ups, downs [hidden, N], stored blocks) of the `e` experts of width
    `n` (with `rows`, those rows and down's columns): from the checkpoint's `gate_up_proj`
    [E, hidden, 2N] and `down_proj` [E, N, hidden], or a GGUF's stacks `gate`/`up`
    [E, N, hidden] and `down` [E, hidden, N] (llama.cpp's `ffn_*_exps`; their blocks for
    `qgemm` where the file's kind has them, as `moe.SparseMoE` reads every family's)."""
    if p + "gate.weight" in w:
        t = _ExpertTensors(w, p, ("gate", "up", "down"), e)
        t.rows = rows
        picked = [t.weights(i) for i in range(e)]
        blocks = [t.blocks(i) for i in range(e)]
        return [x[0] for x in picked], [x[1] for x in picked], [x[2] for x in picked], blocks
    a, b = rows or (0, n)
    gate_up, down = w[p + "gate_up_proj"], w[p + "down_proj"]
    gates = [gate_up[i][:, a:b].T for i in range(e)]
    ups = [gate_up[i][:, n + a : n + b].T for i in range(e)]
    downs = [down[i][a:b].T for i in range(e)]
    return gates, ups, downs, [(None,) * 3] * e


class Llama4Model(LlamaModel):
    layer_class = Llama4Layer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if self.config.family.has_experts(index):
            return Llama4Moe(self, w, prefix, ctx)
        return GatedMLP(ctx, w, prefix + "feed_forward.")

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        caches = super().build_rope_caches(max_positions)
        t = self.config.family.llama4
        if t.temperature_tuning and not all(map(self.config.family.has_rope,
                                                range(self.config.num_layers))):  # fmt: skip
            p = torch.arange(max_positions, dtype=torch.float32)
            scale = torch.log1p(torch.floor((p + 1.0) / t.floor_scale)) * t.attn_scale + 1.0
            caches[TEMPERATURE] = scale.unsqueeze(-1).to(self.device)
        return caches
