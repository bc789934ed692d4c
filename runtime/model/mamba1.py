"""Mamba-1 (`MambaForCausalLM`: state-spaces/mamba-130m to 2.8b; `FalconMambaForCausalLM`:
Falcon-Mamba-7B): each layer ``x + mixer(norm(x))``, no attention, no MLP (configs read in
`mamba1_config.py`, `MambaConfig.mixer` "mamba1"). Jamba's Mamba layers run the mixer here too
(`jamba.py`), and Zamba's (`zamba.py`: its channels in heads, each with its own x_proj,
dt_proj, B and C; the state [heads, P, d_state], one head of d_inner here).

The mixer (transformers' `MambaMixer`): in_proj gives x and the gate z (d_inner each); x goes
through a causal depthwise conv of width ``d_conv`` and SiLU; x_proj gives the time step's
low-rank input, B and C (d_state each; Falcon-Mamba normalises the three by a weightless
RMSNorm, `mixer_rms_eps`, Jamba by RMSNorms with weights, `dt_layernorm`, `b_layernorm`,
`c_layernorm`); dt = softplus(dt_proj(.)) per channel; the selective scan

    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t,    y_t = h_t C_t + D x_t

runs per channel with A [d_inner, d_state] (not a scalar per head as Mamba2's: no SSD form);
y gated by SiLU(z), then out_proj.

Each sequence keeps its conv state [d_inner, d_conv - 1] and SSM state [d_inner, d_state] in
the hybrids' slots (`worker/mamba_state.py`, SSM slots [1, d_inner, d_state]). A step's decode
rows are one batched recurrence step over their slots (gathered and scattered with index ops,
in place where the slots are one run); its prefill chunks run the conv together
(`mamba2.packed_conv`) and the scan in a position-major layout (`ssd.pack` with chunks of one
token: the sequences sorted by length, position j of every sequence that has one, so the
sequences still running at j are the first ``counts[j]``): one torch step per position of the
step's longest chunk, vectorised over its sequences and channels (the decays exp(dt A) and
inputs dt B x of a block of rows computed at once, `BLOCK_ELEMENTS` float32 each). No
per-sequence loop, no host sync; the per-position loop is the cost of a selective scan without
a kernel of its own (`benchmarks/recurrent_families.py`, docs/runtime.md).

Tensor parallel (Mamba's, Falcon-Mamba's and Jamba's mixers; `Mamba1Mixer.split`): each rank
its channels of d_inner, its state slots theirs; x_proj and out_proj row-parallel (each one
all-reduce: dt, B and C read every channel; Falcon-Mamba's and Jamba's norms on them whole on
every rank after it).

Prefix caching (`core/state_snapshots.py`): the scan passes through every sequence's state at
every token, so snapshot boundaries fall every block (`MambaConfig.snapshot_chunk` 1): one
inside a prefill chunk saves the state before its position from the scan's loop (the
positions that have one planned on the host: `ScanGroup.snap_runs`) and the conv inputs
before it (`packed_conv`); one at a chunk's end, the states left in the slot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba2 import (
    MAMBA_STEP,
    MambaStep,
    conv_step,
    packed_conv,
    save_chunk_ends,
)
from pagoda.runtime.model.parallel_linear import column_linear, row_linear
from pagoda.runtime.recurrent_configs import MambaConfig

BLOCK_ELEMENTS = 1 << 22  # the prefill scan's decays and inputs [rows, D, N] computed per block


def selective_step(
    state: torch.Tensor,  # [S, H, P, N] float32, updated in place
    x: torch.Tensor,  # [S, H, P] float32
    dt: torch.Tensor,  # [S, H, P] float32, softplus'd
    A: torch.Tensor,  # [H, P, N]
    B: torch.Tensor,  # [S, H, N] float32
    C: torch.Tensor,  # [S, H, N] float32
) -> torch.Tensor:
    """One token of each of S sequences: y [S, H, P] (transformers'
    `mamba_selective_state_update`, without D and the gate; H heads of P channels, each head's
    B and C its own: one head of d_inner for Mamba-1, Zamba's `n_mamba_heads`)."""
    state.mul_(torch.exp(dt[..., None] * A)).add_((dt * x)[..., None] * B[:, :, None, :])
    return torch.matmul(state, C[..., None])[..., 0]


class Mamba1Mixer:
    """One Mamba-1 layer's weights and forward (module docstring)."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, ctx) -> None:
        p = prefix + "mamba."
        self.index = index
        if ctx.tp is not None:  # this rank's channels of d_inner (`split`)
            self.m = m.on_ranks(ctx.tp.layout.size)
            self.split(m, w, p, ctx)
        else:
            self.m = m
            self.in_proj = linear_layer(ctx, w, [p + "in_proj.weight"])
            self.x_proj = linear_layer(ctx, w, [p + "x_proj.weight"])
            self.dt_proj = linear_layer(ctx, w, [p + "dt_proj.weight"])
            self.out_proj = linear_layer(ctx, w, [p + "out_proj.weight"])
            self.conv_weight = w[p + "conv1d.weight"][:, 0, :].contiguous()  # [D, K]
            self.conv_bias = w[p + "conv1d.bias"] if m.conv_bias else None
            self.A = self.read_a(w, p)
            self.D = w[p + "D"].float().reshape(-1)  # [D]
        self.bcdt_weights = None  # Jamba's norms' weights on dt, B and C
        if m.bcdt_weighted:
            self.bcdt_weights = [w[f"{p}{n}_layernorm.weight"] for n in ("dt", "b", "c")]

    def split(self, m: MambaConfig, w: DeviceWeights, p: str, ctx) -> None:
        """Tensor parallel: this rank's channels [c0, c1) of d_inner: its rows of in_proj's x
        and z parts, of the conv, dt_proj (column-parallel), A and D; x_proj
        reads them as input columns (row-parallel: dt, B and C all-reduced, since each reads
        every channel), out_proj too (its partial products all-reduced)."""
        d = m.d_inner
        c0, c1 = ctx.tp.layout.even(d)
        self.in_proj = column_linear(
            ctx, w, [p + "in_proj.weight"] * 2, [(c0, c1), (d + c0, d + c1)]
        )
        self.x_proj = row_linear(ctx, w, p + "x_proj.weight")
        self.dt_proj = column_linear(ctx, w, [p + "dt_proj.weight"])
        self.out_proj = row_linear(ctx, w, p + "out_proj.weight")
        self.conv_weight = w.part(p + "conv1d.weight", 0, c0, c1)[:, 0, :].contiguous()
        self.conv_bias = w.part(p + "conv1d.bias", 0, c0, c1) if m.conv_bias else None
        a_log = w.part(p + "A_log", 0, c0, c1).float()
        self.A = -torch.exp(a_log.view(1, c1 - c0, m.d_state))
        self.D = w.part(p + "D", 0, c0, c1).float().reshape(-1)

    def read_a(self, w: DeviceWeights, p: str) -> torch.Tensor:
        """A [H, P, N], float32 as transformers' (A_log [D, N] for Mamba-1: one head)."""
        m = self.m
        a_log = w[p + "A_log"].float().view(m.n_heads, m.head_dim, m.d_state)
        return -torch.exp(a_log)

    def linears(self) -> list:
        return [self.in_proj, self.x_proj, self.dt_proj, self.out_proj]

    def ssm_inputs(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From the conv's output c [T, D]: dt [T, D] (float32, softplus'd), B and C [T, H, N]
        (float32; one head here)."""
        m = self.m
        dt, B, C = self.x_proj(c).split([m.dt_rank, m.d_state, m.d_state], dim=-1)
        if m.bcdt_eps is not None:  # Falcon-Mamba's weightless norms, Jamba's weighted
            dt, B, C = (_rms(t, m.bcdt_eps) for t in (dt, B, C))
            if self.bcdt_weights is not None:
                dt, B, C = (x * t for x, t in zip(self.bcdt_weights, (dt, B, C)))
        dt = F.softplus(self.dt_proj(dt).float())
        return dt, B.float()[:, None], C.float()[:, None]

    def __call__(self, h: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]; the layer's states updated at the step's slots."""
        m = self.m
        conv, ssm = step.states[self.index]
        x, z = self.in_proj(h).split(m.d_inner, dim=-1)
        nd = step.num_decodes
        c = torch.empty_like(x)
        if nd:
            c[:nd], new = conv_step(self._slots(conv, step, nd), x[:nd], self.conv_weight,
                                    self.conv_bias)  # fmt: skip
            self._write(conv, step, nd, new)
        pre = step.prefill
        if pre is not None:  # (with the conv inputs before snapshot boundaries inside chunks)
            snap = None if pre.snap_conv_rows is None else step.snaps[self.index][0]
            c[nd:] = F.silu(packed_conv(conv, x[nd:], pre, self.conv_weight, self.conv_bias,
                                        snap))  # fmt: skip
        dt, B, C = self.ssm_inputs(c)
        hp = (m.n_heads, m.head_dim)  # (the channels as heads)
        y = torch.empty(c.shape, dtype=torch.float32, device=c.device)
        xf = c.float()
        x3, dt3 = xf.view(-1, *hp), dt.view(-1, *hp)
        if nd:
            state = self._slots(ssm, step, nd).float()  # [nd, H, P, N] (in place: a run)
            y[:nd] = selective_step(state, x3[:nd], dt3[:nd], self.A, B[:nd], C[:nd]).view(nd, -1)
            if step.decode_run is None or ssm.dtype != torch.float32:  # (else in place)
                self._write(ssm, step, nd, state)
        if step.prefill is not None:
            y[nd:] = self._scan(ssm, x3[nd:], dt3[nd:], B[nd:], C[nd:], step).flatten(1)
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        y = (y + xf * self.D) * F.silu(z.float())
        return self.out_proj(y.to(h.dtype))

    @staticmethod
    def _slots(t: torch.Tensor, step: MambaStep, nd: int) -> torch.Tensor:
        run = step.decode_run
        return t[run[0] : run[1]] if run else t.index_select(0, step.slots[:nd])

    @staticmethod
    def _write(t: torch.Tensor, step: MambaStep, nd: int, new: torch.Tensor) -> None:
        run = step.decode_run
        if run:
            t[run[0] : run[1]].copy_(new)
        else:
            t.index_copy_(0, step.slots[:nd], new.to(t.dtype))

    def _scan(self, ssm, x, dt, B, C, step: MambaStep) -> torch.Tensor:
        """The prefill chunks' selective scan (`scan_by_position`), the decays and inputs of a
        block of rows computed at once (`BLOCK_ELEMENTS`)."""
        m = self.m
        per_block = max(1, BLOCK_ELEMENTS // (m.d_inner * m.d_state))
        lo = hi = 0  # rows [lo, hi): their decays and inputs computed
        dA = dBxB = None

        def advance(s, off, n, packed):
            nonlocal lo, hi, dA, dBxB
            xp, dtp, Bp, Cp = packed
            if off + n > hi:  # the next rows' decays and inputs, a block of rows at once
                lo, hi = off, min(xp.shape[0], off + max(n, per_block))
                dA = torch.exp(dtp[lo:hi, ..., None] * self.A)
                dBxB = (dtp[lo:hi] * xp[lo:hi])[..., None] * Bp[lo:hi, :, None, :]
            s.mul_(dA[off - lo : off - lo + n]).add_(dBxB[off - lo : off - lo + n])
            return torch.matmul(s, Cp[off : off + n, ..., None])[..., 0]

        return scan_by_position(ssm, (x, dt, B, C), step, self.index, advance)


def scan_by_position(
    ssm: torch.Tensor, inputs, step: MambaStep, index: int, advance, out: int = 0,
    flat: bool = False,
) -> torch.Tensor:  # fmt: skip
    """A step's prefill chunks' recurrence position by position over the position-major layout
    (module docstring; Mamba-1's scan, the RG-LRU's, RWKV's WKV, xLSTM's mLSTM): the `inputs`
    (token rows) packed into it, each sequence from its slot's state in float32 (`flat`: as
    [n_seq, D]); at each position `advance(s, off, n, packed)` steps `s`, the states of the
    first ``n`` sequences (those still running there), in place over the packed inputs' rows
    [off, off + n) and gives their outputs (shaped as ``inputs[out]``'s rows). The last states
    go back to layer `index`'s slots, the states before prefix caching's boundaries inside the
    chunks to their snapshot entries (`ScanGroup.snap_runs`); the outputs in token order."""
    pre = step.prefill
    g = pre.groups[0]  # (chunks of one token: one group, its rows the positions' runs)
    n_seq, rows = pre.slots.shape[0], g.rows.shape[0]
    state = ssm.index_select(0, pre.slots).float()
    state = state.view(n_seq, -1) if flat else state
    runs = g.snap_runs or {}
    snap = step.snaps[index][1] if runs else None
    packed = [t.new_empty(rows, *t.shape[1:]).index_copy_(0, g.rows, t.index_select(
        0, g.tokens)) for t in inputs]  # fmt: skip
    yp = torch.empty_like(packed[out])
    off = 0
    for n in g.counts:  # the sequences still running at this position: the first n
        if off in runs:  # boundaries here: the states before this position saved
            a, b = runs[off]
            keep = state.index_select(0, g.snap_chunks[a:b] - off)
            snap.index_copy_(0, g.snap_entries[a:b], keep.view(-1, *snap.shape[1:]).to(snap.dtype))
        yp[off : off + n] = advance(state[:n], off, n, packed)
        off += n
    ssm.index_copy_(0, pre.slots, state.view(n_seq, *ssm.shape[1:]).to(ssm.dtype))
    return yp.new_empty(yp.shape).index_copy_(0, g.tokens, yp.index_select(0, g.rows))


def _rms(t: torch.Tensor, eps: float) -> torch.Tensor:
    """Falcon-Mamba's weightless RMSNorm, in float32, back in the input's dtype."""
    f = t.float()
    return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(t.dtype)


class MambaLayer(LlamaLayer):
    """x + mixer(norm(x)): the residual add fused into the next layer's norm, as Llama's."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mixer = Mamba1Mixer(model.config.family.mamba, w, prefix, index, ctx)

    def linears(self):
        return self.mixer.linears()

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)
        return self.mixer(x, step.meta.aux[MAMBA_STEP]), residual


class MambaModel(LlamaModel):
    layer_class = MambaLayer
