"""xLSTM (`xLSTMForCausalLM`: NX-AI's xLSTM-7b; config read in `xlstm_config.py`): each layer
``x + mlstm(norm(x))``, then ``+ ffn(norm(x))`` (SwiGLU; RMSNorms), no attention; the logits
soft-capped. The mLSTM (`MLstm`, transformers' `xLSTMLayer` with its native step kernel): q, k,
v, the output gate o, and per head the input and forget gates i, f (soft-capped); per head a
matrix memory C [dqk, dv], a normalizer n [dqk] and a stabilizer m:

    m' = max(logsigmoid(f) + m, i),   f' = exp(logsigmoid(f) + m - m'),   i' = exp(i - m')
    C = f' C + i' k vᵀ,   n = f' n + i' k
    h = (q̂ C) / (max(|q̂ · n|, exp(-m')) + eps),   q̂ = q / sqrt(dqk)

then a LayerNorm over each head of h, times sigmoid(o), out_proj. Each sequence keeps C, n and
m per layer in one float32 SSM slot [heads, dqk, dv + 2] of the hybrids' state slots
(`worker/mamba_state.py`, `MambaConfig.mixer` "mlstm"; zeroed: transformers' initial state;
no conv state). The decode rows are one batched step over their slots; the prefill chunks run
the recurrence position by position over `ssd.pack`'s position-major layout (Mamba-1's: one
torch step per position of the step's longest chunk over every sequence still running at it;
transformers runs prompts chunkwise, the same recurrence in another order: equal within float32
rounding). Prefix caching keeps snapshots every block. Tensor parallel by heads (N must divide
num_heads, `distributed/layout.mamba_problem`): a rank's heads' rows of q, k, v, the output gate
and both gates (of the fused matrices' parts too), their norm channels and C, n, m state slots
(`MambaConfig.on_ranks`), out_proj row-parallel; the FFN by width. 16 or 32 bits
(`family_options.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import (
    GatedMLP,
    LayerContext,
    LlamaLayer,
    LlamaModel,
    linear_layer,
)
from pagoda.runtime.model.mamba1 import scan_by_position
from pagoda.runtime.model.mamba2 import MambaStep, save_chunk_ends
from pagoda.runtime.model.parallel_linear import column_linear, fused_gate_up, row_linear
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig


def mlstm_step(
    state: torch.Tensor,  # [S, H, K, V + 2] float32 (C, n, m), updated in place
    q: torch.Tensor,  # [S, H, K] float32
    k: torch.Tensor,  # [S, H, K] float32
    v: torch.Tensor,  # [S, H, V] float32
    i: torch.Tensor,  # [S, H] float32, soft-capped
    f: torch.Tensor,  # [S, H] float32, soft-capped
    eps: float,
) -> torch.Tensor:
    """One token of S sequences: h [S, H, V] (module docstring)."""
    dv = v.shape[-1]
    C, n, m = state[..., :dv], state[..., dv], state[:, :, 0, dv + 1]
    f_log = F.logsigmoid(f)
    m_new = torch.maximum(f_log + m, i)
    fa, ia = torch.exp(f_log + m - m_new)[..., None], torch.exp(i - m_new)[..., None]
    C.mul_(fa[..., None]).add_((ia * k)[..., :, None] * v[..., None, :])
    n.mul_(fa).add_(ia * k)
    qs = q * q.shape[-1] ** -0.5
    num = torch.matmul(qs[..., None, :], C)[..., 0, :]
    den = torch.maximum((qs * n).sum(-1).abs(), torch.exp(-m_new)) + eps
    state[..., dv + 1] = m_new[..., None]
    return num / den[..., None]


class MLstm:
    """One layer's mLSTM (module docstring)."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, ctx) -> None:
        p = prefix + "mlstm_layer."
        self.index, self.eps, tp = index, ctx.eps, ctx.tp
        qkvo, gates = ["qkv_opreact"], ["ifgate_preact"]  # weight_mode "fused"'s, else apart
        if not m.fused_projections:
            qkvo, gates = ["q", "k", "v", "ogate_preact"], ["igate_preact", "fgate_preact"]
        qkvo, gates = [f"{p}{n}.weight" for n in qkvo], [f"{p}{n}.weight" for n in gates]
        norm = p + "multihead_norm.weight"
        if tp is None:
            self.m = m
            self.qkvo, self.gates = linear_layer(ctx, w, qkvo), linear_layer(ctx, w, gates)
            self.out_proj = linear_layer(ctx, w, [p + "out_proj.weight"])
            self.norm = w[norm]
            return
        self.m, (h0, h1) = m.on_ranks(tp.layout.size), tp.layout.heads(m.n_heads)
        qk, v = m.n_heads * m.d_state, m.d_inner  # (this rank's heads of each part, below)
        heads = [(h0 * m.d_state, h1 * m.d_state)] * 2 + [(h0 * m.head_dim, h1 * m.head_dim)] * 2
        per_head = [(h0, h1)] * 2
        if m.fused_projections:  # one matrix each: its parts' offsets
            heads = [(a + o, b + o) for (a, b), o in zip(heads, (0, qk, 2 * qk, 2 * qk + v))]
            per_head = [(h0, h1), (m.n_heads + h0, m.n_heads + h1)]
            qkvo, gates = qkvo * 4, gates * 2
        self.qkvo = column_linear(ctx, w, qkvo, heads)
        self.gates = column_linear(ctx, w, gates, per_head)
        self.out_proj = row_linear(ctx, w, p + "out_proj.weight")
        self.norm = w.part(norm, 0, h0 * m.head_dim, h1 * m.head_dim)

    def linears(self) -> list:
        return [self.qkvo, self.gates, self.out_proj]

    def __call__(self, x: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; the layer's states updated at the step's slots."""
        m, t, nd = self.m, x.shape[0], step.num_decodes
        h_, kd, vd = m.n_heads, m.d_state, m.head_dim
        _, ssm = step.states[self.index]
        q, k, v, o = self.qkvo(x).split([h_ * kd, h_ * kd, h_ * vd, h_ * vd], dim=-1)
        q, k, v = q.float().view(t, h_, kd), k.float().view(t, h_, kd), v.float().view(t, h_, vd)
        cap = m.gate_soft_cap
        i, f = (cap * torch.tanh(self.gates(x).float() / cap)).split(h_, dim=-1)
        out = torch.empty_like(v)
        if nd:
            run = step.decode_run
            state = ssm[run[0] : run[1]] if run else ssm.index_select(0, step.slots[:nd])
            out[:nd] = mlstm_step(state, q[:nd], k[:nd], v[:nd], i[:nd], f[:nd], m.kernel_eps)
            if not run:
                ssm.index_copy_(0, step.slots[:nd], state)
        if step.prefill is not None:
            out[nd:] = self._scan(ssm, (q[nd:], k[nd:], v[nd:], i[nd:], f[nd:]), step)
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        mean = out.mean(-1, keepdim=True)  # a LayerNorm over each head, float32
        var = out.var(-1, keepdim=True, unbiased=False)
        hn = ((out - mean) * torch.rsqrt(var + self.eps)).to(x.dtype).reshape(t, -1)
        return self.out_proj(hn * self.norm * torch.sigmoid(o))

    def _scan(self, ssm, inputs: tuple, step: MambaStep) -> torch.Tensor:
        """The prefill chunks' mLSTM recurrence (`mamba1.scan_by_position`)."""

        def advance(s, off, n, packed):
            return mlstm_step(s, *(t[off : off + n] for t in packed), self.m.kernel_eps)

        return scan_by_position(ssm, inputs, step, self.index, advance, out=2)


class XlstmLayer(RecurrentLayer, LlamaLayer):
    """The mLSTM in attention's place, then the FFN (`recurrent_layer.RecurrentLayer`)."""

    mixer: MLstm | None = None

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> MLstm:
        return MLstm(model.config.family.mamba, w, prefix, index, ctx)


class XlstmModel(LlamaModel):
    layer_class = XlstmLayer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if not self.config.family.mamba.fused_projections:
            return super().make_mlp(w, prefix, index, ctx)
        mlp = GatedMLP.__new__(GatedMLP)  # weight_mode "fused": gate and up stored as one
        mlp.gate_up = fused_gate_up(ctx, w, prefix + "mlp.gate_up_proj.weight")  # (a rank's
        down = prefix + "mlp.down_proj.weight"  # rows of each half; down row-parallel)
        mlp.down = linear_layer(ctx, w, [down]) if ctx.tp is None else row_linear(ctx, w, down)
        mlp.act_and_mul = ctx.act_and_mul
        return mlp

    def logits(self, x, head):
        cap = self.config.family.final_logit_softcapping
        return torch.tanh(self.lm_head(x) / cap) * cap
