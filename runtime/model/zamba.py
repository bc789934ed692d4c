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
One rank, 16 or 32 bits (Mamba-1's mixers are not split, nor run in FP8).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.mamba1 import Mamba1Mixer
from pagoda.runtime.model.zamba2 import SharedBlock, Zamba2Layer, Zamba2Model
from pagoda.runtime.recurrent_configs import MambaConfig


class ZambaMixer(Mamba1Mixer):
    """One Zamba layer's mixer (module docstring)."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, ctx) -> None:
        p = prefix + "mamba."
        self.m, self.index = m, index
        d = m.d_inner
        xz = torch.arange(2 * d).view(d, 2).T.reshape(-1)  # x's rows (even), then z's (odd)
        rows = xz.to(w.device)
        bias = w[p + "in_proj.bias"].index_select(0, rows) if m.proj_bias else None
        self.in_proj = ctx.linear(w[p + "in_proj.weight"].index_select(0, rows), bias)
        self.out_proj = ctx.linear(w[p + "out_proj.weight"],
                                   w[p + "out_proj.bias"] if m.proj_bias else None)  # fmt: skip
        self.x_proj = w[p + "x_proj_weight"].transpose(1, 2).contiguous()  # [H, P, r + 2N]
        self.dt_proj = w[p + "dt_proj_weight"].transpose(1, 2).contiguous()  # [H, r, P]
        self.dt_bias = w[p + "dt_proj_bias"][:, None, :]  # [H, 1, P]
        self.conv_weight = w[p + "conv1d.weight"][:, 0, :].contiguous()  # [D, K]
        self.conv_bias = w[p + "conv1d.bias"] if m.conv_bias else None
        self.A = self.read_a(w, p)
        self.D = w[p + "D"].float().reshape(-1)  # [D]
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
