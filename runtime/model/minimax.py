"""MiniMax-Text-01 (`MiniMaxForCausalLM`; config read in `minimax_config.py`), as transformers'
modeling_minimax.py computes it: Mixtral's layer (softmax attention with rotary, GQA; experts
under ``block_sparse_moe``, `moe.SparseMoE`) whose attention is, by layer, either softmax
attention or **lightning attention**, and whose residual stream is the normalised input:
``x = norm(h)``, ``h = alpha * x + beta * attention(x)``, then the same around the MoE
(`recurrent_configs.MiniMaxScales`, by sublayer kind).

Lightning attention (transformers' `MiniMaxLightningAttention`): ``silu(qkv_proj(x))`` split per
head into q, k, v (head_dim each), per head h a state S [head_dim, head_dim] and a decay
exp(-slope_h) (slope_h = 2^(-8 (h + 1) / heads), scaled by 1 - layer / (layers - 1) + 1e-5):

    S <- exp(-slope_h) S + k v^T;    o = q^T S

then an RMSNorm over all heads (eps 1e-6), times sigmoid(output_gate(x)), out_proj. That is
Mamba2's recurrence with dt = 1, A = -slope, B = k, C = q, x = v, one group a head and no D
skip, so the layers run as the hybrids' recurrent layers (`MambaConfig.mixer` "lightning": the
state in the engine's state slots, float32, no conv state): prefill chunks through Mamba2's
chunked scan in its packed layout (`ssd.scan_step`, chunks of ``block_size``, each sequence
from its own slot, prefix-caching snapshots at chunk boundaries), decode rows through its
one-token step (`mamba2.recurrent_step`, or the CPU's native one). transformers computes the
block form on a prompt and the token loop with a cache: the same sums.

Tensor parallelism splits the lightning layers by heads (`LightningAttention`; N must divide
them: `distributed/layout.py`), the softmax attention and the experts as Mixtral's;
``--quantization fp8`` is refused in one line (`family_options`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.cpu import mamba_step
from pagoda.runtime.model import mamba_shard, ssd
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, recurrent_step, save_chunk_ends
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.parallel_linear import column_linear, row_linear
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig


def slopes(heads: int, layer: int, layers: int) -> torch.Tensor:
    """Each head's decay rate in layer `layer` of `layers` (float32 [heads]), as transformers'
    `get_slope_rate`."""
    base = 1 / (2 ** (8 / heads))
    rate = base ** (torch.arange(heads) + 1)
    return rate * (1 - layer / (layers - 1 + 1e-5) + 1e-5)


class LightningAttention:
    """One lightning-attention layer (module docstring). With tensor parallelism a rank holds
    heads [r H/N, (r+1) H/N) (`mamba_shard.shard`): their rows of qkv_proj (q, k and v
    interleaved per head) and output_gate, their decays and state slots, their channels of the
    norm's weight; o_proj row-parallel. The norm over all heads adds the ranks' sums of
    squares (one all-reduce of a float per token)."""

    def __init__(
        self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext,
        layers: int,
    ) -> None:  # fmt: skip
        a = prefix + "self_attn."
        s = mamba_shard.shard(m, None if ctx.tp is None else ctx.tp.layout)
        self.m, self.index, self.rms_norm, self.tp = s.local, index, ctx.rms_norm, ctx.tp
        self.width = m.d_inner  # the norm's (all heads')
        names = [a + "qkv_proj.weight", a + "output_gate.weight"]
        (h0, h1), d = s.heads, m.head_dim
        if ctx.tp is None:  # the q/k/v projection and the output gate read the same x: one matmul
            self.in_proj = linear_layer(ctx, w, names)
            self.out_proj = linear_layer(ctx, w, [a + "o_proj.weight"])  # (out_proj, as listed)
            self.norm = w[a + "norm.weight"]
        else:
            self.in_proj = column_linear(
                ctx, w, names, [(3 * h0 * d, 3 * h1 * d), (h0 * d, h1 * d)]
            )
            self.out_proj = row_linear(ctx, w, a + "o_proj.weight")
            self.norm = w.part(a + "norm.weight", 0, h0 * d, h1 * d)
        self.A = -slopes(m.n_heads, index, layers)[h0:h1].to(w.device)
        self.D = torch.zeros_like(self.A)  # (no skip)
        self.native = mamba_step.load(recurrent_step) if w.device.type == "cpu" else None

    def linears(self) -> list:
        return [self.in_proj, self.out_proj]

    def __call__(self, h: torch.Tensor, step: MambaStep) -> torch.Tensor:
        m, t = self.m, h.shape[0]
        qkv, gate = self.in_proj(h).split([3 * m.d_inner, m.d_inner], dim=-1)
        qkv = F.silu(qkv).view(t, m.n_heads, 3, m.head_dim)
        q, k, v = (x.contiguous() for x in qkv.unbind(2))  # [T, H, D] each
        _, ssm = step.states[self.index]
        y = torch.empty(t, m.n_heads, m.head_dim, dtype=torch.float32, device=h.device)
        dt = torch.ones(t, m.n_heads, dtype=torch.float32, device=h.device)
        nd = step.num_decodes
        if nd:
            y[:nd] = self._decode(ssm, q[:nd], k[:nd], v[:nd], dt[:nd], step)
        pre = step.prefill
        if pre is not None:
            snaps = None if step.snaps is None or pre.snap_conv_rows is None else step.snaps[
                self.index][1]  # fmt: skip
            y[nd:] = ssd.scan_step(v[nd:], dt[nd:], self.A, k[nd:], q[nd:], ssm, pre.groups,
                                   m.chunk_size, snaps)  # fmt: skip
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        return self.out_proj(torch.sigmoid(gate) * self._norm(y.view(t, m.d_inner).to(h.dtype)))

    def _norm(self, o: torch.Tensor) -> torch.Tensor:
        """RMSNorm over all heads (eps 1e-6) as `ops.rms_norm`: this rank's channels of it, the
        mean square from every rank's sum of squares."""
        if self.tp is None:
            return self.rms_norm(x=o, weight=self.norm, eps=1e-6)
        x = o.float()
        squares = self.tp.all_reduce(x.pow(2).sum(-1, keepdim=True))
        return (x * torch.rsqrt(squares / self.width + 1e-6)).to(o.dtype) * self.norm

    def _decode(self, ssm, q, k, v, dt, step: MambaStep) -> torch.Tensor:
        """The decode rows' one step (`mamba2.Mamba2Mixer._decode`'s, without the conv)."""
        nd, run = q.shape[0], step.decode_run
        slots = step.slots[:nd]
        if self.native is not None and ssm.dtype == torch.float32:  # one pass, in the slots
            return self.native(ssm, slots, v, dt, self.A, k, q, self.D)
        in_place = run is not None and ssm.dtype == torch.float32
        state = ssm[run[0] : run[1]] if in_place else ssm.index_select(0, slots).float()
        y, state = recurrent_step(state, v.float(), dt, self.A, k, q, self.D)
        if not in_place:
            ssm.index_copy_(0, slots, state.to(ssm.dtype))
        return y


class MiniMaxLayer(RecurrentLayer, LlamaLayer):
    """Softmax or lightning attention, then the experts, each ``alpha * x + beta * f(x)`` of
    its normalised input x (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        s = model.config.family.mamba.minimax
        self.scales = s.linear_attn if self.mixer is not None else s.full_attn
        self.mlp_scales = s.mlp

    def make_mixer(self, model: LlamaModel, w, prefix: str, index: int, ctx: LayerContext):
        c = model.config
        return LightningAttention(c.family.mamba, w, prefix, index, ctx, c.num_layers)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, None]:
        norm, eps = self.ctx.rms_norm, self.ctx.eps
        x = norm(x=h, weight=self.attn_norm, eps=eps)  # (the stream: the layer's output)
        if self.mixer is not None:
            out = self.mixer(x, step.meta.aux[MAMBA_STEP])
        else:
            out = self.attention(x, step)
        (alpha, beta), (mlp_alpha, mlp_beta) = self.scales, self.mlp_scales
        x = norm(x=x * alpha + out * beta, weight=self.mlp_norm, eps=eps)
        return x * mlp_alpha + self.mlp(x) * mlp_beta, None


class MiniMaxModel(LlamaModel):
    """MiniMax-Text-01 (module docstring)."""

    layer_class = MiniMaxLayer
    moe_names = ("block_sparse_moe.", ("w1", "w3", "w2"))
    make_mlp = make_mlp

    def final_hidden(self, h: torch.Tensor, residual: None) -> torch.Tensor:
        return self.rms_norm(x=h, weight=self.norm, eps=self.config.rms_norm_eps)
