"""Zamba (`ZambaForCausalLM`: Zyphra's Zamba-7B-v1; configs read in `zamba_config.py`): Zamba2's
layout (`zamba2.py`) over Mamba-1 mixers: a mixer in every layer, x + mixer(norm(x)), and on
the hybrid layers the one shared transformer block before it, whose output t goes through the
layer's own `linear` and joins the mixer's input only: x + mixer(norm(x + linear(t))).

The block (`ZambaBlock`, its weights held once, no adapters): attention over [x, embeddings]
(2 x hidden, head_dim 2 x hidden / heads, softmax scale (head_dim / 2) ** -0.5, no rotary),
then a gated MLP (gate_proj and up_proj stacked, exact GELU by default), each after its norm
and without a residual add; each use a KV cache of its own (the hybrid layers are the model's
attention layers).

The mixer (`ZambaMixer`): Mamba-1's (`mamba1.Mamba1Mixer`: the conv, the selective scan over
the state slots of `worker/mamba_state.py`, prefix-cache snapshots at any block) with its
d_inner channels in `n_mamba_heads` heads of P, each head its own x_proj [dt_rank + 2 d_state,
P], dt_proj [P, dt_rank] (with its bias) and so its own B and C: the two projections are one
batched matmul over the heads each, the scan's state [H, P, d_state] per sequence. in_proj's
rows interleave x and the gate (transformers views its output [D, 2]): split apart at load.
16 or 32 bits (Mamba-1's mixers do not run in FP8). Tensor parallel: the mixers by heads (a
rank's in_proj rows, x_proj, dt_proj, conv channels, A and D; out_proj row-parallel: one
all-reduce, no other, since each head reads only its own channels), its state slots its heads';
the shared block's attention by heads and its MLP by width (`zamba2.SharedBlock`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.mamba1 import Mamba1Mixer
from pagoda.runtime.model.parallel_linear import row_linear
from pagoda.runtime.model.zamba2 import SharedBlock, Zamba2Layer, Zamba2Model
from pagoda.runtime.recurrent_configs import MambaConfig


class ZambaMixer(Mamba1Mixer):
    """One Zamba layer's mixer (module docstring)."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, ctx) -> None:
        p = prefix + "mamba."
        tp = ctx.tp
        self.m, self.index = m if tp is None else m.on_ranks(tp.layout.size), index
        h0, h1 = (0, m.n_heads) if tp is None else tp.layout.even(m.n_heads)  # this rank's heads
        c0, c1 = h0 * m.head_dim, h1 * m.head_dim  # their channels of d_inner

        def rows(name: str, start: int, stop: int) -> torch.Tensor:
            return w[name] if tp is None else w.part(name, 0, start, stop)

        d = c1 - c0  # in_proj's rows interleave x and z: this rank's [2 c0, 2 c1)
        xz = torch.arange(2 * d, device=w.device).view(d, 2).T.reshape(-1)  # x (even), z (odd)
        bias = rows(p + "in_proj.bias", 2 * c0, 2 * c1).index_select(0, xz) if m.proj_bias else None
        self.in_proj = ctx.linear(rows(p + "in_proj.weight", 2 * c0, 2 * c1).index_select(0, xz),
                                  bias)  # fmt: skip
        self.out_proj = row_linear(ctx, w, p + "out_proj.weight")  # (its bias once, after)
        x_proj, dt_proj = rows(p + "x_proj_weight", h0, h1), rows(p + "dt_proj_weight", h0, h1)
        self.x_proj = x_proj.transpose(1, 2).contiguous()  # [H, P, r + 2N]
        self.dt_proj = dt_proj.transpose(1, 2).contiguous()  # [H, r, P]
        self.dt_bias = rows(p + "dt_proj_bias", h0, h1)[:, None, :]  # [H, 1, P]
        self.conv_weight = rows(p + "conv1d.weight", c0, c1)[:, 0, :].contiguous()  # [D, K]
        self.conv_bias = rows(p + "conv1d.bias", c0, c1) if m.conv_bias else None
        self.A = -torch.exp(rows(p + "A_log", h0, h1).float())  # [H, P, N]
        self.D = rows(p + "D", h0, h1).float().reshape(-1)  # [D]
        self.bcdt_weights = None

    def linears(self) -> list:
        return [self.in_proj, self.out_proj]

    def ssm_inputs(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """dt [T, D] (float32, softplus'd), B and C [T, H, N] (float32): each head's."""
        m = self.m
        heads = c.view(-1, m.n_heads, m.head_dim).transpose(0, 1)  # [H, T, P]
        dt, B, C = torch.bmm(heads, self.x_proj).split([m.dt_rank, m.d_state, m.d_state], dim=-1)
        dt = torch.baddbmm(self.dt_bias, dt, self.dt_proj)  # [H, T, P]
        dt = F.softplus(dt.float()).transpose(0, 1).reshape(c.shape)
        return dt, B.float().transpose(0, 1), C.float().transpose(0, 1)


class ZambaBlock(SharedBlock):
    """Zamba's shared block: Zamba2's without adapters, the MLP's gate and up apart."""

    gate_up_names = ("gate_proj", "up_proj")

    def projections(self, ctx: LayerContext, w: DeviceWeights, use: int, z) -> tuple:
        return self.qkv, self.gate_up


class ZambaLayer(Zamba2Layer):
    def make_mixer(self, m, w: DeviceWeights, p: str, index: int, ctx: LayerContext):
        return ZambaMixer(m, w, p, index, ctx)


class ZambaModel(Zamba2Model):
    layer_class = ZambaLayer
    block_class = ZambaBlock
