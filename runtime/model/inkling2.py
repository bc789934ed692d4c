"""Inkling 2 (`Inkling2ForCausalLM`; `Inkling2ForConditionalGeneration` read text-only; config
read in `inkling2_config.py`), as transformers runs it: Inkling's model (`inkling.py`: no
rotary, normed embeddings, relative-position logits through the torch attention backend's
``rel_bias``, four short convs a layer over one conv state in the hybrids' slots, window layers
with their own KV heads) with:

- block attention residuals: every `n_layers_per_attn_res_block`-th layer's input joins the
  blocks; a layer's attention input (the full layers' q, k and v inputs: three queries), its
  MLP input and the final norm's input are softmax mixes, by a learned query, of the
  RMS-normalised blocks and the running partial sum (transformers' `Inkling2BlockAttentionResidual`);
- q (a learned scale per head and dim) and k L2-clipped to `qk_l2_clip_threshold`, v
  RMS-normalised without weight, the relative states scaled and clipped to
  `rel_l2_clip_threshold`; on the full layers q and the relative states scaled by
  ``1 + alpha * log(max((p + 1) / floor, 1))``; softmax scale head_dim^-1/2;
- a sink logit per token and head (`sink_proj`: the torch backend's per-row ``sinks``);
  attention's output gated by sigmoid(`o_proj.gate_proj`(x)) before `o_proj.linear`;
- the short convs' outputs ``(x + conv(x)) / sqrt(K + 1)``; the full layers' k/v convs dynamic:
  taps `static_weight` plus `weight_proj` of the k/v input per token and KV head,
  ``(x + conv(x)) / sqrt(2K + 1)``;
- experts in every layer: SwiGLU with the linear gate factor and up softcapped, routed by
  sigmoid scores (plus `e_score_correction_bias` for the choice) normalised over the top-k,
  times `route_scale`; the logits soft-capped (`final_logit_softcapping`), the head
  `unpadded_vocab_size` rows beside a `vocab_size`-row embedding;
- Inkling2Loop (`Inkling2LoopForCausalLM`, `...ForConditionalGeneration`: `Inkling2Layers.loop`):
  layers [start, end) run `passes` times, each further pass from the pre-loop hidden state and
  blocks on copies of those layers (`pass_copy`: the weights shared, their own KV caches and
  conv states after the model's layers), its q/k/v and MLP inputs gated
  ``(1 - tanh(forget)) x + tanh(gain) m`` (`Inkling2Layer.gate`) with messages m: softmax
  mixes, by learned queries per looped layer and input, of the last pass's blocks (less the
  pre-loop output) and its output (transformers' `Inkling2LoopTextModel`).

Tensor parallelism as Inkling's (`inkling.py`), the output gate, sinks and clip scales with
their query heads, the dynamic taps with their KV heads; the block residuals and loop gates
over whole hidden states, alike on every rank; the head by rows of its first `vocab_size`.
FP8 is refused (`family_options`); on CUDA the torch attention backend
runs, the experts one Linear each (their softcapped SwiGLU is no fused kernel's).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionBackend
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.inkling2_config import MESSAGE_QUERIES
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, packed_conv, save_chunk_ends
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.parallel_linear import ParallelLMHead, column_linear, row_linear

TAU = "inkling2_tau"  # `Step.rope`'s entry: (positions, float32 [T, 1, 1] the full layers' scale)


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """float32 RMSNorm of `x` (times `weight` in float32 where given), as transformers'."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return out if weight is None else weight.float() * out


def l2_clip(x: torch.Tensor, threshold: float, scale: torch.Tensor | None = None) -> torch.Tensor:
    """float32 `x` (times `scale`) shrunk to L2 norm `threshold` per row where longer."""
    xf = x.float() if scale is None else x.float() * scale.float()
    norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
    return xf * (threshold / (norm + 1e-6)).clamp(max=1.0)


def block_mix(query: torch.Tensor, blocks: list[torch.Tensor], partial: torch.Tensor):
    """float32 [T, nq, H]: each query's softmax mix of the RMS-normalised blocks and `partial`."""
    stacked = rms(torch.stack([*blocks, partial], dim=1), None, 1e-6)  # [T, n, H]
    q = query.float().view(-1, stacked.shape[-1])
    p = torch.softmax(torch.einsum("qh,tnh->tqn", q, stacked) * stacked.shape[-1] ** -0.5, -1)
    return torch.einsum("tqn,tnh->tqh", p, stacked)


class Convs:
    """One layer's four convs over its conv state's channel ranges: each token's window of
    K inputs (oldest first) from the slots and the step (`mamba2.packed_conv`)."""

    def __init__(self, index: int, kv: int, hidden: int, k: int) -> None:
        self.index, self.k = index, k
        self.ranges = {"k": (0, kv), "v": (kv, 2 * kv), "attn": (2 * kv, 2 * kv + hidden),
                       "mlp": (2 * kv + hidden, 2 * kv + 2 * hidden)}  # fmt: skip

    def _unfold(self, w: torch.Tensor) -> torch.Tensor:  # [1, C, L] -> [1, C K, L - K + 1]
        u = w.unfold(2, self.k, 1)
        return u.permute(0, 1, 3, 2).reshape(1, -1, u.shape[2])

    def windows(self, which: str, x: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """float32 [T, C, K] windows of `x` [T, C]; the inputs written to the slots."""
        c0, c1 = self.ranges[which]
        conv = step.states[self.index][0][:, c0:c1]
        xf = x.float()
        out = xf.new_empty(*xf.shape, self.k)
        nd = step.num_decodes
        if nd:
            run, slots = step.decode_run, step.slots[:nd]
            state = conv[run[0] : run[1]] if run else conv.index_select(0, slots)
            window = torch.cat([state.float(), xf[:nd, :, None]], dim=-1)
            if run:
                state.copy_(window[..., 1:])
            else:
                conv.index_copy_(0, slots, window[..., 1:].to(conv.dtype))
            out[:nd] = window
        if step.prefill is not None:
            pre = step.prefill
            snap = None if pre.snap_conv_rows is None else step.snaps[self.index][0][:, c0:c1]
            got = packed_conv(conv, xf[nd:], pre, None, None, snap, self._unfold)
            out[nd:] = got.view(-1, xf.shape[1], self.k)
        return out

    def static(self, which: str, x: torch.Tensor, weight: torch.Tensor, step) -> torch.Tensor:
        w = self.windows(which, x, step)
        y = ((w * weight).sum(-1) + x.float()) / math.sqrt(self.k + 1)
        return y.to(x.dtype)

    def dynamic(self, which, x, static, proj, source, heads: int, step) -> torch.Tensor:
        """Per-token taps: `static` [C, K] (oldest first) plus `proj`(source) per KV head."""
        t, c = x.shape
        w = self.windows(which, x, step).view(t, heads, c // heads, self.k)
        taps = static.view(heads, c // heads, self.k) + proj(source).float().view(
            t, heads, 1, self.k).flip(-1)  # fmt: skip
        y = ((w * taps).sum(-1).view(t, c) + x.float()) / math.sqrt(2 * self.k + 1)
        return y.to(x.dtype)


def capped_swiglu(gate_cap: float, up_cap: float):
    def act(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.float().chunk(2, dim=-1)
        g = torch.tanh(gate / gate_cap) * gate_cap * torch.sigmoid(gate)
        return (g * torch.tanh(up / up_cap) * up_cap).to(x.dtype)

    return act


class Inkling2MoE:
    def __init__(self, model: Inkling2Model, w: DeviceWeights, prefix: str, ctx) -> None:
        f, ink = model.config.family, model.config.family.mamba.inkling2
        p = prefix + "mlp."
        self.top_k, self.scale = f.num_experts_per_tok, ink.route_scale
        self.router = w.source(p + "gate.weight").float()
        self.bias = w.source(p + "gate.e_score_correction_bias").float()
        act = capped_swiglu(ink.gate_cap, ink.up_cap)
        ctx = dataclasses.replace(ctx, act_and_mul=lambda x: act(x))
        gate_up, down = p + "experts.gate_up_proj", p + "experts.down_proj"
        if ctx.tp is None:
            gate_up, down = w[gate_up], w[down]
        else:  # this rank's rows of the width (gate's and up's by turns: one run), down's cols
            r0, r1 = ctx.tp.layout.even(f.moe_intermediate_size)
            gate_up, down = w.part(gate_up, 1, 2 * r0, 2 * r1), w.part(down, 2, r0, r1)
        e, n2, hidden = gate_up.shape  # stored interleaved: gate and up rows by turns
        gate_up = gate_up.view(e, n2 // 2, 2, hidden).transpose(1, 2).reshape(e, n2, hidden)
        experts = [(ctx.linear(gate_up[e]), ctx.linear(down[e])) for e in range(f.num_experts)]
        self.experts = SparseMoE(ctx, None, experts, None, None, self.top_k, True, False)
        self.tp = ctx.tp

    def linears(self) -> list:
        return [x for pair in self.experts.experts for x in pair]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.sigmoid(F.linear(x.float(), self.router))
        ids = torch.topk(scores + self.bias, self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * self.scale
        out = self.experts.run_experts(x, weights, ids)  # (a rank's width of them: summed)
        return out if self.tp is None else self.tp.all_reduce(out)


class Inkling2Layer(LlamaLayer):
    def __init__(
        self, model: Inkling2Model, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c, ink = model.config, model.config.family.mamba.inkling2
        backend = model.layer_backend(index)
        hkv, d = backend.num_kv_heads, backend.head_dim
        self.ctx = ctx = dataclasses.replace(ctx, backend=backend, num_kv_heads=hkv)
        self.index, self.ink, self.eps = index, ink, c.rms_norm_eps
        a, p = prefix + "self_attn.", prefix
        self.full = not ink.sliding[index]
        self.boundary = index % ink.block == 0
        self.window, self.chunk, self.rope, self.kv_scales = c.family.window(index), *[None] * 3
        if self.full:
            self.norms = [w[f"{p}{x}_input_layernorm.weight"] for x in "qkv"]
        else:
            self.norms = [w[p + "input_layernorm.weight"]]
        self.attn_query = w.source(p + "attention_input.query").float() if index else None
        self.mlp_query = w.source(p + "mlp_input.query").float()
        self.mlp_norm = w[p + "post_attention_layernorm.weight"]
        r, k = a + "relative_position_bias.", c.family.mamba.d_conv
        (h0, h1), (k0, k1) = model.local_heads(index)
        # the q input's matrices in one: q, the output gate, the sinks, the relative states
        self.q = _rows(ctx, w, [a + "q_proj.linear.weight", a + "o_proj.gate_proj.weight",
                                a + "sink_proj.weight", r + "linear.weight"],
                       [(h0 * d, h1 * d), (h0 * d, h1 * d), (h0, h1),
                        (h0 * ink.d_rel, h1 * ink.d_rel)])  # fmt: skip
        nh = ctx.num_heads  # (this rank's)
        self.q_sizes = [nh * d, nh * d, nh, nh * ink.d_rel]
        # (copies: a slice would keep every head's)
        self.q_scale = w.source(a + "q_proj.norm.scale")[h0:h1].float().clone()
        self.rel_scale = w.source(r + "norm.scale")[h0:h1].float().clone()
        self.rel = w[r + "proj"]
        self.o_proj = row_linear(ctx, w, a + "o_proj.linear.weight")  # (whole on one rank)
        kv = (k0 * d, k1 * d)  # this rank's k/v channels
        if self.full:
            self.k = _rows(ctx, w, [a + "k_proj.linear.weight"], [kv])
            self.v = _rows(ctx, w, [a + "v_proj.linear.weight"], [kv])
            self.k_dyn, self.v_dyn = (_rows(ctx, w, [f"{a}{x}_proj.sconv.weight_proj.weight"],
                                            [(k0 * k, k1 * k)]) for x in "kv")  # fmt: skip
            self.k_static, self.v_static = (
                w.source(f"{a}{x}_proj.sconv.static_weight")[:, kv[0] : kv[1]].float().t()
                .flip(-1).contiguous() for x in "kv")  # fmt: skip
        else:
            self.kv = _rows(ctx, w, [a + "k_proj.linear.weight", a + "v_proj.linear.weight"],
                            [kv, kv])  # fmt: skip
            self.k_conv, self.v_conv = (
                w.source(f"{a}{x}_proj.sconv.conv1d.weight")[kv[0] : kv[1], 0].float().clone()
                for x in "kv")  # fmt: skip
        self.attn_conv, self.mlp_conv = (
            w.source(f"{p}post_{x}_convolution.conv1d.weight").float()[:, 0, :].contiguous()
            for x in ("attention", "mlp"))  # fmt: skip
        self.convs = Convs(index, hkv * d, c.hidden_size, c.family.mamba.d_conv)
        self.mlp = Inkling2MoE(model, w, prefix, ctx)
        start, end, _, _ = ink.loop  # Inkling2Loop's message gates (q, k, v, mlp inputs)
        self.gates = [(w[f"{p}{x}_message_gate.down_proj.weight"],
                       w.source(f"{p}{x}_message_gate.forget_gate_proj.weight").float(),
                       w.source(f"{p}{x}_message_gate.message_gate_proj.weight").float())
                      for x in ("q", "k", "v", "mlp")] if start <= index < end else []  # fmt: skip

    def pass_copy(self, index: int) -> Inkling2Layer:
        """This layer (its weights shared) on cache index `index`: a further loop pass's."""
        layer = copy.copy(self)
        layer.index, layer.convs = index, copy.copy(self.convs)
        layer.convs.index = index
        return layer

    def gate(self, which: int, x: torch.Tensor, message: torch.Tensor) -> torch.Tensor:
        """float32 ``(1 - forget) * x + gate * message`` (transformers' Inkling2LoopMessageGate)."""
        down, forget, gate = self.gates[which]
        xf, mf = x.float(), message.float()
        g = torch.cat([rms(xf, None, self.eps), rms(mf, None, self.eps)], dim=-1)
        g = F.linear(g.to(down.dtype), down).float()
        return (1 - torch.tanh(F.linear(g, forget))) * xf + torch.tanh(F.linear(g, gate)) * mf

    def linears(self) -> list:
        own = [self.k, self.v, self.k_dyn, self.v_dyn] if self.full else [self.kv]
        return [self.q, *own, self.o_proj, *self.mlp.linears()]

    def attention(self, xs: list[torch.Tensor], step: Step) -> torch.Tensor:
        ctx, mstep, ink = self.ctx, step.meta.aux[MAMBA_STEP], self.ink
        xq, xk, xv = xs
        t, h, hkv, d = xq.shape[0], ctx.num_heads, ctx.num_kv_heads, ctx.head_dim
        q, gate, sinks, rel = self.q(xq).split(self.q_sizes, dim=-1)
        if self.full:
            k = self.convs.dynamic("k", self.k(xk), self.k_static, self.k_dyn, xk, hkv, mstep)
            v = self.convs.dynamic("v", self.v(xv), self.v_static, self.v_dyn, xv, hkv, mstep)
        else:
            k, v = self.kv(xk).split(hkv * d, dim=-1)
            if xv is not xk:  # (a looped pass's gated inputs: v's own)
                v = self.kv(xv)[:, hkv * d :]
            k = self.convs.static("k", k, self.k_conv, mstep)
            v = self.convs.static("v", v, self.v_conv, mstep)
        dtype = xq.dtype
        q = l2_clip(q.view(t, h, d), ink.qk_clip, self.q_scale).to(dtype)
        rel = l2_clip(rel.view(t, h, -1), ink.rel_clip, self.rel_scale).to(dtype)
        if self.full:
            tau = step.rope[TAU][1]
            q, rel = (q.float() * tau).to(dtype), (rel.float() * tau).to(dtype)
        k = l2_clip(k.view(t, hkv, d), ink.qk_clip).to(dtype)
        v = rms(v.view(t, hkv, d), None, self.eps).to(dtype)
        k_cache, v_cache = step.kv_caches[self.index]
        out = ctx.backend.forward(q, k, v, k_cache, v_cache, step.meta, window=self.window,
                                  sinks=sinks.float(), rel_bias=rel @ self.rel)  # fmt: skip
        out = (out.reshape(t, h * d).float() * torch.sigmoid(gate.float())).to(dtype)
        return self.convs.static("attn", self.o_proj(out), self.attn_conv, mstep)

    def __call__(self, h, blocks: list[torch.Tensor], step: Step, messages=None) -> torch.Tensor:
        """`messages`: float32 [T, 4, H], a further loop pass's (q, k, v, mlp inputs)."""
        dtype, mstep = h.dtype, step.meta.aux[MAMBA_STEP]
        norms = self.norms
        if self.attn_query is None:
            ins = [h] * len(self.norms)
        else:
            ins = list(block_mix(self.attn_query, blocks, h).unbind(1))
        if messages is not None:
            ins = [self.gate(j, ins[j % len(ins)], messages[:, j]) for j in range(3)]
            norms = norms * (3 // len(norms))
        xs = [rms(x, wt, self.eps).to(dtype) for x, wt in zip(ins, norms)]
        a = self.attention(xs * (3 // len(xs)), step).float()
        if self.boundary:
            blocks, residual = [*blocks, h], a
        else:
            residual = a = h.float() + a
        x = block_mix(self.mlp_query, blocks, a)[:, 0]
        if messages is not None:
            x = self.gate(3, x, messages[:, 3])
        m = self.mlp(rms(x, self.mlp_norm, self.eps).to(dtype))
        m = self.convs.static("mlp", m, self.mlp_conv, mstep)
        save_chunk_ends(mstep, self.index)  # prefix caching: boundaries at a chunk's end
        return (residual + m.float()).to(dtype)


class Inkling2Model(LlamaModel):
    layer_class = Inkling2Layer

    def __init__(self, config, weights, **kwargs) -> None:
        self._backends: dict[tuple[int, int], AttentionBackend] = {}
        super().__init__(config, weights, **kwargs)
        n, (start, end, passes, _) = config.num_layers, config.family.mamba.inkling2.loop
        # Inkling2Loop's further passes over layers [start, end): their own caches after n's
        self.passes = [[self.layers[i].pass_copy(n + (p - 1) * (end - start) + i - start)
                        for i in range(start, end)] for p in range(1, passes)]  # fmt: skip

    def local_heads(self, index: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Cache index `index`'s query heads and KV heads [start, stop) on this rank: all of
        them on one, else as `layout.py` splits (or replicates) them."""
        kv = self.config.kv_layer_shapes[index][0]
        if self.tp is None:
            return (0, self.config.num_heads), (0, kv)
        return self.tp.layout.heads(self.config.num_heads), self.tp.layout.kv_heads(kv)

    def layer_backend(self, index: int) -> AttentionBackend:
        k0, k1 = self.local_heads(index)[1]
        shape = (k1 - k0, self.config.kv_layer_shapes[index][1])
        if shape not in self._backends:
            self._backends[shape] = self.backend.with_geometry(*shape)
        return self._backends[shape]

    @property
    def kv_backends(self) -> list[AttentionBackend]:
        return [self.layer_backend(i) for i in range(self.config.num_kv_layers)]

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        # the head's first `vocab_size` rows (stored padded to the embedding's): a rank's
        self.vocab_size = v = self.config.vocab_size
        if self.tp is None:
            self.lm_head = ctx.linear(w["lm_head.weight"][:v])
        else:  # (rows past `v` cut from the gathered logits)
            rows = w.part("lm_head.weight", 0, *self.tp.layout.vocab(v))
            self.lm_head = ParallelLMHead(ctx.linear(rows), v, self.tp)
        self.embed_norm = w["model.embed_tokens.embed_norm.weight"]
        self.final_query = w.source("model.final_input.query").float()
        start, end, _, _ = self.config.family.mamba.inkling2.loop
        if end > start:  # [looped layers, 4, H]: the messages' (q, k, v, mlp) queries
            qm, kv = (w.source(n).float().unflatten(0, (-1, 2)) for n in MESSAGE_QUERIES)
            self.message_query = torch.cat([qm[:, :1], kv, qm[:, 1:]], dim=1)

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        return {}  # (no rotary)

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, meta) -> dict:
        ink = self.config.family.mamba.inkling2
        n = (positions + 1).float() / ink.log_floor
        return {
            TAU: (positions, (1.0 + ink.log_alpha * torch.log(n.clamp(min=1.0))).view(-1, 1, 1))
        }

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        eps = self.config.rms_norm_eps
        e = self.embed_tokens(input_ids)
        h = rms(e, self.embed_norm, eps).to(e.dtype)
        step = Step(meta, kv_caches, self._rope_rows(positions, h.dtype, meta))
        start, end, _, _ = self.config.family.mamba.inkling2.loop
        h, blocks = self._run(self.layers[:start], h, [], step)
        pre = h, blocks
        h, blocks = self._run(self.layers[start:end], h, blocks, step)
        for layers in self.passes:  # from the pre-loop states, messages from the last pass
            # (its blocks less the first, the pre-loop output again)
            q = self.message_query
            msgs = block_mix(q, blocks[len(pre[1]) + 1 :], h).view(h.shape[0], *q.shape)
            h, blocks = self._run(layers, pre[0], pre[1], step, msgs)
        h, blocks = self._run(self.layers[end:], h, blocks, step)
        blocks = [b.index_select(0, logits_indices) for b in blocks]
        h = h.index_select(0, logits_indices)
        x = block_mix(self.final_query, blocks, h)[:, 0]
        return self.logits(rms(x, self.norm, eps).to(h.dtype), head)

    @staticmethod
    def _run(layers, h, blocks, step, msgs=None):
        blocks = list(blocks)
        for j, layer in enumerate(layers):
            new = layer(h, blocks, step, None if msgs is None else msgs[:, j])
            if layer.boundary:
                blocks.append(h)
            h = new
        return h, blocks

    def logits(self, x, head):
        cap = self.config.family.final_logit_softcapping
        if not cap:
            return super().logits(x, head)
        return torch.tanh(self.lm_head(x) / cap) * cap


def _rows(ctx: LayerContext, w: DeviceWeights, names: list[str], parts: list[tuple[int, int]]):
    """The matrices `names` stacked: whole on one rank, else rows `parts[i]` of each."""
    if ctx.tp is None:
        return linear_layer(ctx, w, names)
    return column_linear(ctx, w, names, parts)
