"""LFM2 (`Lfm2ForCausalLM`: LiquidAI LFM2-350M, 700M, 1.2B, 2.6B; config read in
`lfm2_config.py`): each layer ``x + operator(norm(x))``, then ``+ mlp(norm(x))`` (SwiGLU), the
operator by `layer_types`:

- attention as Qwen3's (`qwen3.Qwen3Layer`: an RMSNorm over each head of q and k before
  rotary), or
- a gated short convolution (`ShortConv`, transformers' `Lfm2ShortConv`): in_proj gives B, C
  and x (hidden wide each); B * x goes through a causal depthwise conv of width
  ``conv_L_cache`` (no activation), C gates its output, out_proj projects it back.

The final norm is `embedding_norm` (read as `model.norm`). A conv layer keeps, per sequence,
its last ``conv_L_cache - 1`` conv inputs in the hybrids' state slots (`worker/mamba_state.py`,
`MambaConfig.mixer` "short_conv": a conv state alone); the step's slots and packed prefill
layout come as the Mamba2 layers' do (`mamba2.MambaStep`): the decode rows one batched conv
step over their slots, the prefill chunks one conv over each sequence's state and tokens
(`ssd.pack`'s conv segments), so a prompt split over steps computes what one pass would.
LFM2-MoE (`Lfm2MoeForCausalLM`) is this model with `moe.SparseMoE` experts after its first
dense layers (`lfm2_config.py`). LFM3 (`Lfm3ForCausalLM`, `Lfm3Layer`) adds sliding-window
attention layers with their own rotary (Llama's "local" table; the full layers' is
"proportional", `ops.rope_inv_freq`; both applied in float32 and rounded once, as transformers'
float32 cos and sin: `rotary_float32`), each head's attention output times sigmoid(gate_proj(x)),
and RMSNorms on the operator's and the MLP's outputs before their residual adds (GLM-4's
`glm4_norms`). Prefix caching keeps snapshots of the conv states every block
(`engine/recurrent.py`: a boundary's state is the inputs before it, saved from the conv
segments inside a chunk, from the slot at a chunk's end). Tensor parallel: the short convs by
channels (`ShortConv`: a rank's rows of B, C and x, its conv channels and their states;
out_proj row-parallel), attention by heads (LFM3's head gate with them), the MLPs and experts
by width; N must divide hidden_size (`distributed/layout.py`).
"""

from __future__ import annotations

import functools

import torch
from pagoda.runtime.model import ops
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, packed_conv, save_chunk_ends
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.parallel_linear import column_linear, row_linear
from pagoda.runtime.model.qwen3 import Qwen3Layer
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig


class ShortConv:
    """One conv layer's weights and forward (module docstring)."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, ctx) -> None:
        p = prefix + "conv."
        self.index = index
        if ctx.tp is None:
            self.width = m.d_inner
            self.in_proj = linear_layer(ctx, w, [p + "in_proj.weight"])
            self.out_proj = linear_layer(ctx, w, [p + "out_proj.weight"])
            self.weight = w[p + "conv.weight"][:, 0, :].contiguous()  # [C, K]
            self.bias = w[p + "conv.bias"] if m.conv_bias else None
            return
        # tensor parallel: this rank's channels [c0, c1): their rows of B, C and x, of the conv
        # (its state slots theirs); out_proj row-parallel (one all-reduce)
        d = m.d_inner
        c0, c1 = ctx.tp.layout.even(d)
        self.width = c1 - c0
        rows = [(c0, c1), (d + c0, d + c1), (2 * d + c0, 2 * d + c1)]
        self.in_proj = column_linear(ctx, w, [p + "in_proj.weight"] * 3, rows)
        self.out_proj = row_linear(ctx, w, p + "out_proj.weight")
        self.weight = w.part(p + "conv.weight", 0, c0, c1)[:, 0, :].contiguous()
        self.bias = w.part(p + "conv.bias", 0, c0, c1) if m.conv_bias else None

    def linears(self) -> list:
        return [self.in_proj, self.out_proj]

    def __call__(self, h: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]; the layer's conv states updated at the step's slots."""
        conv, _ = step.states[self.index]
        B, C, x = self.in_proj(h).split(self.width, dim=-1)
        bx = B * x
        out = torch.empty_like(bx)
        nd = step.num_decodes
        if nd:
            out[:nd] = self._decode(conv, bx[:nd], step)
        if step.prefill is not None:
            out[nd:] = self._prefill(conv, bx[nd:], step)
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        return self.out_proj(C * out)

    def _decode(self, conv: torch.Tensor, bx: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """One token of each decode row: its window (state, then the token), the new state
        written back to its slot (in place where the slots are one run)."""
        nd, run = bx.shape[0], step.decode_run
        slots = step.slots[:nd]
        state = conv[run[0] : run[1]] if run else conv.index_select(0, slots)
        window = torch.cat([state, bx[..., None].to(state.dtype)], dim=-1)  # [S, C, K]
        out = (window * self.weight).sum(-1)
        if self.bias is not None:
            out = out + self.bias
        if run:
            state.copy_(window[..., 1:])
        else:
            conv.index_copy_(0, slots, window[..., 1:])
        return out.to(bx.dtype)

    def _prefill(self, conv: torch.Tensor, bx: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """The prefill chunks in one conv over each sequence's segment (its conv state, then
        its tokens: `ssd.pack`), the new states (each segment's last inputs) to their slots;
        the inputs before prefix caching's boundaries inside the chunks to their snapshots."""
        pre = step.prefill
        snap = None if pre.snap_conv_rows is None else step.snaps[self.index][0]
        return packed_conv(conv, bx, pre, self.weight, self.bias, snap)


class Lfm2Layer(RecurrentLayer, Qwen3Layer):
    """Attention (Qwen3's) or a short conv, then the MLP (`recurrent_layer.RecurrentLayer`);
    the residual adds fused into the norms, as Llama's."""

    mixer: ShortConv | None = None

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> ShortConv:
        return ShortConv(model.config.family.mamba, w, prefix, index, ctx)


class Lfm2Model(LlamaModel):
    layer_class = Lfm2Layer
    # LFM2-MoE's experts (`moe.SparseMoE`), its router and choice-only bias
    moe_names = ("feed_forward.", ("w1", "w3", "w2"))
    moe_router, moe_bias = "gate.weight", "expert_bias"

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if self.config.family.has_experts(index):
            return SparseMoE.from_weights(self, w, prefix, ctx)
        return GatedMLP(ctx, w, prefix + "feed_forward.", ("w1", "w3", "w2"))


class Lfm2MoeModel(Lfm2Model):
    """LFM2-MoE (`Lfm2MoeForCausalLM`): LFM2's layers, experts after the first dense ones
    (`lfm2_config.py`)."""


# the rotate-half rotary in float32 with float32 cos and sin, rounded once (transformers' LFM3)
rotary_float32 = functools.partial(ops.rotary_float32, ops.rotary_embedding)


class Lfm3Layer(Lfm2Layer):
    """LFM2's layer with LFM3's head gate on attention's output and its sandwich norms (the
    operator's and the MLP's outputs normalised before their residual adds)."""

    post_attn_norm: torch.Tensor | None = None
    post_mlp_norm: torch.Tensor | None = None
    gate = None  # the checkpoint's gate_proj (transformers' g_proj): one sigmoid gate a head

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        f = model.config.family
        if f.glm4_norms:
            self.post_attn_norm = model.norm_weight(w[prefix + "post_self_attn_layernorm.weight"])
            self.post_mlp_norm = model.norm_weight(w[prefix + "post_mlp_layernorm.weight"])
        if self.mixer is None and f.mamba.attn_head_gate:
            gate = [prefix + "self_attn.gate_proj.weight"]
            if ctx.tp is None:
                self.gate = linear_layer(ctx, w, gate)
            else:  # its heads' rows
                heads = ctx.tp.layout.heads(model.config.num_heads)
                self.gate = column_linear(ctx, w, gate, [heads])
        if self.mixer is None:
            self.rotary = rotary_float32

    def linears(self):
        return [*super().linears(), *([self.gate] if self.gate is not None else [])]

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.gate is None:
            return out
        gate = torch.sigmoid(self.gate(x))  # [T, heads]
        t, h = gate.shape
        return (out.view(t, h, -1) * gate.unsqueeze(-1)).view(t, -1)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        x, residual = self.attention_input(h, residual)
        if self.mixer is not None:
            h = self.mixer(x, step.meta.aux[MAMBA_STEP])
        else:
            h = self.attention(x, step)
        if self.post_attn_norm is not None:
            h = norm(x=h, weight=self.post_attn_norm, eps=eps)
        x, residual = norm(x=h, weight=self.mlp_norm, eps=eps, residual=residual)
        h = self.mlp(x)
        if self.post_mlp_norm is not None:
            h = norm(x=h, weight=self.post_mlp_norm, eps=eps)
        return h, residual


class Lfm3Model(Lfm2Model):
    """LFM3 (`Lfm3ForCausalLM`): `Lfm3Layer`s; the sliding layers read the "local" rotary
    table (`FamilyConfig.local_rope_theta`), the full ones the "global" (proportional) one."""

    layer_class = Lfm3Layer

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, meta) -> dict:
        return super()._rope_rows(positions, torch.float32, meta)  # cos and sin in float32
