"""Inkling (`InklingForCausalLM`; `InklingForConditionalGeneration` read text-only; config
read in `inkling_config.py`), as transformers runs it. No rotary: positions enter through
relative-position logits and short convolutions. The embeddings are RMS-normalised
(`embed_tokens.embed_norm`); each layer is

    s = s + sconv_a(attention(norm(s)));  s = s + sconv_m(mlp(norm(s)))

with ``sconv(x) = x + conv(x)``, a causal depthwise conv of `conv_kernel_size` taps, no bias,
in float32. Attention: q from q_proj, k and v from k_proj / v_proj through short convs of
their own, each head of q and k RMS-normalised (the softmax scale 1 / head_dim); the scores
get relative-position logits (transformers' `InklingRelativeLogits`): each query's r_proj row,
`d_rel` per head, mixes the layer's `rel_logits_proj.proj` profiles into one logit per
backward distance below the extent (`rel_extent`, the window on window layers), added to the
score of the key at that distance (the torch attention backend's ``rel_bias``: `base.py`). On
the full layers with `log_scaling_n_floor`, q and those logits are scaled by
``1 + alpha * log(max((p + 1) / floor, 1))`` of the query's position p. Window layers have
their own KV heads and head size (their backend: `AttentionBackend.with_geometry`; q scaled by
``head_dim / swa_head_dim`` so that the shared softmax scale is theirs).

The MLP is SwiGLU times a learned scalar (`global_scale`), or experts: the router's float32
sigmoid scores plus `e_score_correction_bias` pick the top-k routed experts; their logits and
the shared experts' (the router's last rows) give weights ``sigmoid(l) / sum sigmoid(l)`` over
both, times `route_scale` and the router's `global_scale`; the shared experts (stacked) run as
experts every token picks, with those weights (`moe.SparseMoE.run_experts`).

The four convs' last ``conv_kernel_size - 1`` inputs are one conv state per sequence and layer
in the hybrids' state slots beside the KV cache ([k | v | attention's output | the MLP's
output] channels: `MambaConfig.inkling`, `parallel_attention`): decode rows one batched window
over their slots, prefill chunks one conv over each sequence's state and tokens
(`mamba2.packed_conv`), so chunked prefill, preemption and prefix caching's snapshots work as
LFM2's short convs do. The final hidden states are divided by `logits_mup_width_multiplier`
before the head.

Tensor parallelism: each rank its query heads (their q and r_proj rows, their relative logits)
and each layer's KV heads (split, or replicated when fewer than ranks: the window layers'
own count, `inkling_config.tp_problem`) with their k/v conv channels and state slots;
o_proj row-parallel, so attention's and the MLP's output convs run over whole hidden states,
the same on every rank (their state slots too); the dense MLP and the routed and shared experts
by width (one all-reduce), the router whole. FP8 is refused (`family_options`); on CUDA the
torch attention backend runs (the Triton kernels take no relative logits).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import (
    GatedMLP,
    LayerContext,
    LlamaLayer,
    LlamaModel,
    Step,
    linear_layer,
)
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, packed_conv, save_chunk_ends
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.parallel_linear import column_linear, row_linear

TAU = "inkling_tau"  # `Step.rope`'s entry: (positions, float32 [T, 1, 1] full layers' q scale)


class ShortConvs:
    """One layer's four convs over its conv state's channel ranges (module docstring)."""

    def __init__(
        self, w: DeviceWeights, prefix: str, index: int, kv: tuple[int, int], hidden: int
    ) -> None:
        """`kv`: the k/v channels [start, stop) this rank holds (its KV heads')."""
        a = prefix + "self_attn."

        def read(name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
            t = w.source(name + ".conv1d.weight")
            t = t if rows is None else t[rows[0] : rows[1]]
            return t[:, 0].float().clone()  # [C, K] (a copy: a slice would keep every row)

        self.index = index
        # k and v in one conv (depthwise: their channels side by side)
        self.kv = torch.cat([read(a + "k_sconv", kv), read(a + "v_sconv", kv)])
        kv = kv[1] - kv[0]
        self.attn, self.mlp = read(prefix + "attn_sconv"), read(prefix + "mlp_sconv")
        self.ranges = {"kv": (0, 2 * kv), "attn": (2 * kv, 2 * kv + hidden),
                       "mlp": (2 * kv + hidden, 2 * kv + 2 * hidden)}  # fmt: skip

    def __call__(self, which: str, x: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """``x + conv(x)`` [T, C] in float32, rounded to x's dtype; the conv inputs of `which`
        updated in the slots (and prefix caching's snapshots inside the chunks)."""
        c0, c1 = self.ranges[which]
        weight = getattr(self, which)
        conv = step.states[self.index][0][:, c0:c1]
        xf = x.float()
        out = torch.empty_like(xf)
        nd = step.num_decodes
        if nd:
            out[:nd] = self._decode(conv, xf[:nd], weight, step)
        if step.prefill is not None:
            pre = step.prefill
            snap = None if pre.snap_conv_rows is None else step.snaps[self.index][0][:, c0:c1]
            out[nd:] = packed_conv(conv, xf[nd:], pre, weight, None, snap)
        return (out + xf).to(x.dtype)

    @staticmethod
    def _decode(conv, x: torch.Tensor, weight: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """One token of each decode row: its window (state, then the token), the new state
        written back to its slot (in place where the slots are one run)."""
        run, slots = step.decode_run, step.slots[: x.shape[0]]
        state = conv[run[0] : run[1]] if run else conv.index_select(0, slots)
        window = torch.cat([state.float(), x[..., None]], dim=-1)  # [S, C, K]
        out = (window * weight).sum(-1)
        if run:
            state.copy_(window[..., 1:])
        else:
            conv.index_copy_(0, slots, window[..., 1:].to(conv.dtype))
        return out


class ScaledMLP(GatedMLP):
    """Inkling's dense MLP: SwiGLU times its learned scalar."""

    __slots__ = ("scale",)

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str) -> None:
        super().__init__(ctx, w, prefix)
        self.scale = w[prefix + "global_scale"]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) * self.scale


class InklingMoE:
    """Routed and shared experts (module docstring): the shared ones appended to the routed
    ones, every token picking them."""

    def __init__(self, model: InklingModel, w: DeviceWeights, prefix: str, ctx) -> None:
        f, ink = model.config.family, model.config.family.mamba.inkling
        p = prefix + "mlp."
        self.top_k, self.shared, self.routed = (
            f.num_experts_per_tok,
            ink.shared_experts,
            f.num_experts,
        )
        self.router = w.source(p + "gate.weight").float()  # [E + S, hidden]
        self.bias = w.source(p + "gate.e_score_correction_bias").float()
        scale = w.source(p + "gate.global_scale").float()
        self.scale = scale * ink.route_scale
        gate_up, down, sg, su, sd = _expert_tensors(w, p, f.moe_intermediate_size, ctx)
        w13 = torch.cat([gate_up, torch.cat([sg, su], dim=1)])  # [E + S, 2N, hidden]
        w2 = torch.cat([down, sd])  # [E + S, hidden, N]
        if w.device.type == "cuda":
            experts = []
        else:
            experts = [(ctx.linear(w13[e]), ctx.linear(w2[e])) for e in range(w13.shape[0])]
            w13 = w2 = None
        self.experts = SparseMoE(ctx, None, experts, w13, w2, self.top_k + self.shared,
                                 False, False)  # fmt: skip
        self.shared_ids = torch.arange(self.routed, self.routed + self.shared, device=w.device)
        self.tp = ctx.tp

    def linears(self) -> list:
        return [x for pair in self.experts.experts for x in pair]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.float(), self.router)  # [T, E + S]
        routed, shared = logits[:, : self.routed], logits[:, self.routed :]
        choice = torch.sigmoid(routed) + self.bias
        ids = torch.topk(choice, self.top_k, dim=-1, sorted=False)[1]
        picked = F.logsigmoid(torch.cat([routed.gather(1, ids), shared], dim=-1))
        weights = torch.exp(picked - torch.logsumexp(picked, dim=-1, keepdim=True)) * self.scale
        weights = weights.to(x.dtype).float()  # (transformers' weights: the model's dtype)
        ids = torch.cat([ids, self.shared_ids.expand(ids.shape[0], -1)], dim=-1)
        out = self.experts.run_experts(x, weights, ids)  # (a rank's width of them: summed)
        return out if self.tp is None else self.tp.all_reduce(out)


def _expert_tensors(w: DeviceWeights, p: str, n: int, ctx) -> list[torch.Tensor]:
    """The routed experts' gate_up [E, 2N, hidden] and down [E, hidden, N], the shared ones'
    gate, up [S, N, hidden] and down [S, hidden, N]: whole, or this rank's rows [r0, r1) of N
    (of each half of gate_up; down's columns), only those read."""
    e, s = p + "experts.", p + "shared_experts."
    if ctx.tp is None:
        return [w[e + "gate_up_proj"], w[e + "down_proj"],
                *(w[s + x] for x in ("gate_proj", "up_proj", "down_proj"))]  # fmt: skip
    r0, r1 = ctx.tp.layout.even(n)
    gate_up = e + "gate_up_proj"
    return [torch.cat([w.part(gate_up, 1, r0, r1), w.part(gate_up, 1, n + r0, n + r1)], dim=1),
            w.part(e + "down_proj", 2, r0, r1), w.part(s + "gate_proj", 1, r0, r1),
            w.part(s + "up_proj", 1, r0, r1), w.part(s + "down_proj", 2, r0, r1)]  # fmt: skip


class InklingLayer(LlamaLayer):
    """The layer of the module docstring; the residual adds fused into the norms, as Llama's."""

    def __init__(
        self, model: InklingModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c, ink = model.config, model.config.family.mamba.inkling
        backend = model.layer_backend(index)
        hkv, d = backend.num_kv_heads, backend.head_dim
        self.ctx = ctx = dataclasses.replace(ctx, backend=backend, num_kv_heads=hkv, head_dim=d)
        self.index, a = index, prefix + "self_attn."
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        names = [f"{a}{n}_proj.weight" for n in "qkvr"]
        kv_rows = (0, hkv * d)
        if ctx.tp is None:
            self.qkvr = linear_layer(ctx, w, names)
        else:  # this rank's query heads (q, r) and KV heads (k, v)
            h0, h1 = ctx.tp.layout.heads(c.num_heads)
            k0 = model.local_kv_heads(index)[0]
            kv_rows = (k0 * d, (k0 + hkv) * d)
            q_rows, r_rows = (h0 * d, h1 * d), (h0 * ink.d_rel, h1 * ink.d_rel)
            self.qkvr = column_linear(ctx, w, names, [q_rows, kv_rows, kv_rows, r_rows])
        self.o_proj = row_linear(ctx, w, a + "o_proj.weight")  # (whole on one rank)
        self.sizes = [ctx.num_heads * d, hkv * d, hkv * d, ctx.num_heads * ink.d_rel]
        self.q_norm, self.k_norm = w[a + "q_norm.weight"], w[a + "k_norm.weight"]
        self.rel = w[a + "rel_logits_proj.proj"]  # [d_rel, extent]
        self.window, self.chunk, self.rope, self.kv_scales = (
            c.family.window(index),
            None,
            None,
            None,
        )
        self.log_scaled = self.window is None and ink.log_floor is not None
        # the backend's scale is 1 / head_dim of the full layers: a window layer's own
        self.q_scale = c.head_dim / d if d != c.head_dim else None
        self.convs = ShortConvs(w, prefix, index, kv_rows, c.hidden_size)
        self.mlp = model.make_mlp(w, prefix, index, ctx)

    def linears(self) -> list:
        return [self.qkvr, self.o_proj, *self.mlp.linears()]

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        ctx, mstep = self.ctx, step.meta.aux[MAMBA_STEP]
        t, h, hkv, d = x.shape[0], ctx.num_heads, ctx.num_kv_heads, ctx.head_dim
        q, k, v, r = self.qkvr(x).split(self.sizes, dim=-1)
        k, v = self.convs("kv", torch.cat([k, v], dim=-1), mstep).split(hkv * d, dim=-1)
        norm, eps = ctx.rms_norm, ctx.eps
        q = norm(x=q.reshape(-1, d), weight=self.q_norm, eps=eps).view(t, h, d)
        k = norm(x=k.reshape(-1, d), weight=self.k_norm, eps=eps).view(t, hkv, d)
        bias = r.reshape(t, h, -1) @ self.rel  # [T, H, extent]
        if self.log_scaled:  # (in float32, as transformers)
            tau = step.rope[TAU][1]
            q, bias = (q.float() * tau).to(q.dtype), (bias.float() * tau).to(bias.dtype)
        if self.q_scale is not None:
            q = q * self.q_scale
        k_cache, v_cache = step.kv_caches[self.index]
        out = ctx.backend.forward(q, k, v.reshape(t, hkv, d), k_cache, v_cache, step.meta,
                                  window=self.window, rel_bias=bias)  # fmt: skip
        return self.convs("attn", self.o_proj(out.reshape(t, h * d)), mstep)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)
        h = self.attention(x, step)
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        mstep = step.meta.aux[MAMBA_STEP]
        out = self.convs("mlp", self.mlp(x), mstep)
        save_chunk_ends(mstep, self.index)  # prefix caching: boundaries at a chunk's end
        return out, residual


class InklingModel(LlamaModel):
    layer_class = InklingLayer

    def __init__(self, config, weights, **kwargs) -> None:
        self._backends: dict[tuple[int, int], AttentionBackend] = {}
        super().__init__(config, weights, **kwargs)

    def local_kv_heads(self, index: int) -> tuple[int, int]:
        """Layer `index`'s KV heads [start, stop) on this rank: all of them on one, else split
        or replicated by `layout.py` (the window layers have their own count)."""
        kv = self.config.kv_layer_shapes[index][0]
        return (0, kv) if self.tp is None else self.tp.layout.kv_heads(kv)

    def layer_backend(self, index: int) -> AttentionBackend:
        """Layer `index`'s backend: the model's, or the window layers' shape's (this rank's
        KV heads)."""
        k0, k1 = self.local_kv_heads(index)
        shape = (k1 - k0, self.config.kv_layer_shapes[index][1])
        if shape not in self._backends:
            self._backends[shape] = self.backend.with_geometry(*shape)
        return self._backends[shape]

    @property
    def kv_backends(self) -> list[AttentionBackend]:
        return [self.layer_backend(i) for i in range(self.config.num_layers)]

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        self.embed_norm = w["model.embed_tokens.embed_norm.weight"]

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if self.config.family.has_experts(index):
            return InklingMoE(self, w, prefix, ctx)
        return ScaledMLP(ctx, w, prefix + "mlp.")

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        return {}  # (no rotary)

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, meta) -> dict:
        """The full layers' q scale by position (`log_scaling_n_floor`), where they have one."""
        ink = self.config.family.mamba.inkling
        if ink.log_floor is None:
            return {}
        n = (positions + 1).float() / ink.log_floor
        tau = 1.0 + ink.log_alpha * torch.log(n.clamp(min=1.0))
        return {TAU: (positions, tau.view(-1, 1, 1))}

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(input_ids)
        return self.rms_norm(x=e, weight=self.embed_norm, eps=self.config.rms_norm_eps)

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        return super().final_hidden(h, residual) / self.config.family.mamba.inkling.logits_divisor
