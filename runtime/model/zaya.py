"""Zaya (`ZayaForCausalLM`: Zyphra's ZAYA1; config read in `zaya_config.py`), as transformers
runs it. The residual stream is float32 (ZAYA's `residual_in_fp32`), and each layer is

    x = norm(s);  s = scale(attention(x), s);  x = norm(s);  s = scale(experts(x), s)

with ``scale(y, s) = (y + b_y) * w_y + (s + b_s) * w_s`` (`ZayaResidualScaling`); the
embeddings enter as ``(e + b) * w``. Attention (Phi-3's o_proj, the scale head_dim ** -0.5):

- q and k (`ZayaCCAProjection`): q_proj and k_proj's outputs through a causal depthwise conv
  of `cca_time0` taps, then a conv of `cca_time1` taps grouped by head, plus a residual: the
  mean of each query and its KV head's key for q, that averaged over the group for k;
- v: half of the value channels from the token (`v_proj_current`), half from the token before
  (`v_proj_delayed`, zero before the first);
- q and k L2-normalised to sqrt(head_dim), k then scaled per KV head (`qk_norm.temp`), then
  rotary (half of each head by default: `rope_parameters["hybrid"]`).

The conv's inputs before a token (the last ``time0 + time1 - 2`` q/k projections) and the
delayed value projection of the token before are a short conv state per sequence in the
hybrids' state slots beside the KV cache (`MambaConfig.zaya`, `parallel_attention`): decode
rows one batched window over their slots, prefill chunks one conv over each sequence's state
and tokens (`mamba2.packed_conv` with the conv here), so chunked prefill, preemption and prefix
caching's snapshots work as LFM2's short convs do.

Experts (`moe.SparseMoE`: Qwen3-MoE's SwiGLU experts, stacked `gate_up_proj` / `down_proj`),
one per token, picked by a router MLP (`ZayaRouter`): down_proj to `router_hidden_size`, plus
the previous layer's router state times `router_states_scale`, this sum being the state the
next layer reads; then RMSNorm, fc1, GELU, fc2, GELU, out_proj to one logit per expert and a
skip choice; the softmax's top choice by probability plus `balancing_biases`, weighted by its
probability; the skip choice weighs 0. The LM head may have a bias (`lm_head_bias`).

Tensor parallelism: each rank its query and KV heads (`CCAProjection`: N must divide the KV
heads), o_proj row-parallel, the experts by width (their partial sums all-reduced), the router
and the residual scalings whole on every rank. FP8 is refused (`family_options`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, packed_conv, save_chunk_ends
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.parallel_linear import column_linear, row_linear


class CCAProjection:
    """q, k and v of one layer from its conv state (module docstring). On a tensor-parallel
    rank: its query heads and KV heads (N divides the KV heads, `zaya_config.tp_problem`, so
    its query heads are those of its KV heads: the residuals stay on the rank), their q/k
    channels of both convs; the values' halves whole, each rank's KV heads cut from them (the
    delayed half whole in the conv state too: `MambaConfig.on_ranks`)."""

    def __init__(self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx):
        c = model.config
        z, p = c.family.mamba.zaya, prefix + "self_attn.qkv_proj."
        self.index, self.ctx, d = index, ctx, c.head_dim
        self.heads, self.kv, self.d = ctx.num_heads, ctx.num_kv_heads, d
        self.qk = (self.heads + self.kv) * d
        # q, k and the delayed values in one matmul (the conv's inputs: `server/weights.py`
        # counts them as one), the current values
        names = [p + "q_proj.weight", p + "k_proj.weight", p + "v_proj_delayed.weight"]
        self.v_current = linear_layer(ctx, w, [p + "v_proj_current.weight"])
        convs = [p + f"conv_qk_{n}.{x}" for n in ("depthwise", "grouped")
                 for x in ("weight", "bias")]  # fmt: skip
        if ctx.tp is None:
            self.proj = linear_layer(ctx, w, names)
            self.w0, self.b0, self.w1, self.b1 = (w[n] for n in convs)
            self.values = None
        else:  # this rank's q/k rows (of the projections and the convs), every delayed value
            q_rows, k_rows, _ = ctx.tp.layout.qkv_rows(c.num_heads, c.num_kv_heads, d)
            delayed = c.num_kv_heads * d // 2
            self.proj = column_linear(ctx, w, names, [q_rows, k_rows, (0, delayed)])
            k_conv = tuple(c.num_heads * d + r for r in k_rows)  # (the convs' k after all q)
            self.w0, self.b0, self.w1, self.b1 = (
                torch.cat([w.part(n, 0, *q_rows), w.part(n, 0, *k_conv)]) for n in convs
            )
            self.values = k_rows  # this rank's value channels of the whole [current | delayed]
        self.k = z.time0 + z.time1 - 1  # the window: the conv state's inputs, then the token

    def linears(self) -> list:
        return [self.proj, self.v_current]

    def conv(self, window: torch.Tensor) -> torch.Tensor:
        """[B, C, L] conv inputs -> [B, C, L - k + 1]: q/k's two convs, the delayed values
        shifted by one token."""
        qk, v = window[:, : self.qk], window[:, self.qk :]
        qk = F.conv1d(qk, self.w0, self.b0, groups=self.qk)
        qk = F.conv1d(qk, self.w1, self.b1, groups=self.heads + self.kv)
        n = qk.shape[-1]
        return torch.cat([qk, v[..., self.k - 2 : self.k - 2 + n]], dim=1)

    def __call__(self, x: torch.Tensor, step: MambaStep):
        t, h, kv, d = x.shape[0], self.heads, self.kv, self.d
        raw = self.proj(x)  # [T, q | k | delayed v]
        q, k = raw[:, : h * d].view(t, h, d), raw[:, h * d : self.qk].view(t, kv, d)
        q_res = (q + k.repeat_interleave(h // kv, dim=1)) * 0.5
        k_res = q_res.view(t, kv, h // kv, d).mean(dim=-2)
        mixed = torch.empty_like(raw)
        conv, _ = step.states[self.index]
        nd = step.num_decodes
        if nd:
            mixed[:nd] = self._decode(conv, raw[:nd], step)
        if step.prefill is not None:
            pre = step.prefill
            snap = None if pre.snap_conv_rows is None else step.snaps[self.index][0]
            mixed[nd:] = packed_conv(conv, raw[nd:], pre, None, None, snap, self.conv)
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        q = mixed[:, : h * d].view(t, h, d) + q_res
        k = mixed[:, h * d : self.qk].view(t, kv, d) + k_res
        v = torch.cat([self.v_current(x), mixed[:, self.qk :]], dim=-1)
        if self.values is not None:  # this rank's KV heads of the whole values
            v = v[:, self.values[0] : self.values[1]]
        return q, k, v.reshape(t, kv, d)

    def _decode(self, conv: torch.Tensor, raw: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """One token of each decode row: its window (state, then the token), the new state
        written back to its slot (in place where the slots are one run)."""
        run, slots = step.decode_run, step.slots[: raw.shape[0]]
        state = conv[run[0] : run[1]] if run else conv.index_select(0, slots)
        window = torch.cat([state, raw[..., None].to(state.dtype)], dim=-1)  # [S, C, K]
        out = self.conv(window)[..., 0]
        if run:
            state.copy_(window[..., 1:])
        else:
            conv.index_copy_(0, slots, window[..., 1:])
        return out.to(raw.dtype)


class ZayaRouter:
    """One layer's router (module docstring): (weights, ids, its state) of the MLP's input."""

    def __init__(self, w: DeviceWeights, prefix: str, index: int, ctx, out_proj, experts: int):
        g = prefix + "mlp.gate."
        self.down = linear_layer(ctx, w, [g + "down_proj.weight"])
        self.fc1 = linear_layer(ctx, w, [g + "router_mlp.fc1.weight"])
        self.fc2 = linear_layer(ctx, w, [g + "router_mlp.fc2.weight"])
        self.out_proj, self.experts, self.ctx = out_proj, experts, ctx
        self.norm = w[g + "router_mlp.norm.weight"]
        self.state_scale = w[g + "router_states_scale"] if index else None
        self.biases = w.source(g + "balancing_biases").float()

    def linears(self) -> list:
        return [self.down, self.fc1, self.fc2]

    def __call__(self, x: torch.Tensor, state: torch.Tensor | None):
        r = self.down(x)
        if self.state_scale is not None and state is not None:
            r = r + state * self.state_scale
        y = self.ctx.rms_norm(x=r, weight=self.norm, eps=self.ctx.eps)
        y = F.gelu(self.fc2(F.gelu(self.fc1(y))))
        probs = torch.softmax(self.out_proj(y), dim=-1)
        ids = torch.argmax(probs.float() + self.biases, dim=-1, keepdim=True)
        weights = probs.gather(1, ids).float()
        skip = ids == self.experts  # the skip choice: no expert, weight 0
        return weights.masked_fill(skip, 0.0), ids.masked_fill(skip, 0), r


def _residual_scale(w: DeviceWeights, name: str) -> tuple[torch.Tensor, ...]:
    return tuple(w[f"{name}.{x}"] for x in ("hidden_states_bias", "hidden_states_scale",
                                             "residual_bias", "residual_scale"))  # fmt: skip


def _scaled(y: torch.Tensor, s: torch.Tensor, p: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(y + b_y) * w_y (y's dtype) + (s + b_s) * w_s (float32 s)."""
    return (y + p[0]) * p[1] + (s + p[2]) * p[3]


class ZayaLayer(LlamaLayer):
    """The layer of the module docstring. The stream ``s`` goes from layer to layer in `h`
    (float32); the value passed beside it (Llama's residual) is the router state."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        # Llama's layer without its q/k/v (`CCAProjection`'s), no window, no chunk
        self.ctx, self.index, a = ctx, index, prefix + "self_attn."
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        self.o_proj = row_linear(ctx, w, a + "o_proj.weight")  # (whole on one rank)
        self.kv_scales = model.kv_scales(w, a.rstrip("."))
        self.window = self.chunk = None
        self.rope, self.rotary = model.rope_table(index), ctx.ops.rotary_embedding
        self.mlp = model.make_mlp(w, prefix, index, ctx)
        self.cca = CCAProjection(model, w, prefix, index, ctx)
        temp = prefix + "self_attn.qk_norm.temp"  # per KV head: this rank's
        self.temp = w[temp] if ctx.tp is None else w.part(temp, 0, *ctx.tp.layout.kv_heads(
            model.config.num_kv_heads))  # fmt: skip
        self.eps = torch.finfo(model.dtype).eps
        self.scale = self.ctx.head_dim**0.5
        self.router = ZayaRouter(w, prefix, index, ctx, self.mlp.router,
                                 model.config.family.num_experts)  # fmt: skip
        self.post_attention = _residual_scale(w, prefix + "post_attention_residual_scale")
        self.post_mlp = _residual_scale(w, prefix + "post_mlp_residual_scale")

    def linears(self):
        return [*self.cca.linears(), self.o_proj, *self.router.linears(), *self.mlp.linears()]

    def step_qkv(self, x: torch.Tensor, step: Step):
        return self.cca(x, step.meta.aux[MAMBA_STEP])

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = q * (self.scale / q.norm(p=2, dim=-1, keepdim=True).clamp_min(self.eps))
        k = k * (self.scale / k.norm(p=2, dim=-1, keepdim=True).clamp_min(self.eps))
        return q, k * self.temp[None, :, None]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm, eps, dtype = self.ctx.rms_norm, self.ctx.eps, self.attn_norm.dtype
        s = h
        a = self.attention(norm(x=s.to(dtype), weight=self.attn_norm, eps=eps), step)
        s = _scaled(a, s, self.post_attention)
        x = norm(x=s.to(dtype), weight=self.mlp_norm, eps=eps)
        weights, ids, state = self.router(x, residual)
        y = self.mlp.run_experts(x, weights, ids)  # (this rank's width of them: summed)
        y = y if self.ctx.tp is None else self.ctx.tp.all_reduce(y)
        return _scaled(y, s, self.post_mlp), state


class ZayaModel(LlamaModel):
    layer_class = ZayaLayer
    moe_names = ("mlp.", ("gate_up_proj", "down_proj"))
    moe_suffix = ""  # (transformers 5's stacked parameters: no ".weight")
    moe_router = "gate.router_mlp.out_proj.weight"  # (the router's last matrix: `ZayaRouter`)
    head_bias: torch.Tensor | None = None

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return SparseMoE.from_weights(self, w, prefix, ctx)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        self.in_bias = w["model.input_hidden_states_bias"]
        self.in_scale = w["model.input_hidden_states_scale"]
        if self.config.family.lm_head_bias:
            self.head_bias = w["lm_head.bias"]

    def head_blocks(self, w: DeviceWeights, head: str):
        return None if self.config.family.lm_head_bias else super().head_blocks(w, head)

    def input_embeddings(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return ((self.embed_tokens(input_ids) + self.in_bias) * self.in_scale).float()

    def final_hidden(self, h: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The stream normalised in the model's dtype (`residual`: the router state, unread)."""
        return self.rms_norm(x=h.to(self.dtype), weight=self.norm, eps=self.config.rms_norm_eps)

    def logits(self, x, head):
        if self.head_bias is None:
            return super().logits(x, head)
        return self.lm_head(x) + self.head_bias
