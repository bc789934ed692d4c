"""The Mamba2 mixer of hybrid models (Granite 4.0, Bamba, Nemotron-H, Falcon-H1) over a step's
flattened batch, in pure torch: a port of transformers' `torch_forward` path (the non-CUDA
fallback of `GraniteMoeHybridMambaLayer` / `BambaMixer`, itself the reference of the mamba_ssm
kernels).

Per token: ``in_proj`` gives the gate z, the conv input xBC and the time step dt; xBC goes
through a causal depthwise conv of width ``d_conv`` and SiLU, then splits into x (heads x
head_dim), B and C (groups x d_state); the selective scan

    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t,    y_t = C_t h_t + D x_t

(dt softplus'd with its bias, clamped to the config's limit) runs per head; y is gated by
SiLU(z), normalised per group (`gated_rms_norm`) and projected back by ``out_proj``.

Each sequence carries two states between steps (`worker/mamba_state.py`: preallocated slots,
one per running sequence, zeroed when a sequence starts): the conv state, the last
``d_conv - 1`` conv inputs [conv_dim, d_conv - 1], and the SSM state h [heads, head_dim,
d_state]. A step's rows are decodes first, then prefill chunks (`attention.base`):

- the decode rows (one token each) are one batched recurrence step (`conv_step`,
  `recurrent_step`) over their slots, gathered and scattered back with index ops (on the CPU,
  float32 SSM states in one native pass where they lie: `cpu/mamba_step.py`);
- the prefill chunks run together (`Mamba2Mixer._prefill`) in a chunk-aligned packed layout
  (`ssd.pack`: each sequence's tokens in SSD chunks of its own, padded only to a whole chunk,
  dt 0 on the padding, which then neither decays nor feeds a state): the causal conv over each
  sequence's conv state and tokens, the chunked scan (`ssd.ssd_scan`: SSD, state-space duality,
  as transformers' `mamba2_chunk_scan`, its recurrence restarting at each sequence's first
  chunk from its SSM state); the final states go back to their slots, so a prompt split over
  steps (chunked prefill) computes what one pass would. No loop over sequences, no host sync
  (the layout is built on the host from the scheduled lengths).

With tensor parallelism a rank holds its heads and the B/C groups they read (`mamba_shard.py`):
in_proj column-parallel (its rows of each of the five parts), out_proj row-parallel, the gated
norm's sums of squares gathered where one group spans ranks; its state slots hold its heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.cpu import mamba_step
from pagoda.runtime.model import mamba_shard, ssd
from pagoda.runtime.model.llama import linear_layer
from pagoda.runtime.model.parallel_linear import column_linear, row_linear
from pagoda.runtime.model.ssd import ssd_scan_bytes
from pagoda.runtime.recurrent_configs import MambaConfig

MAMBA_STEP = "mamba"  # the key of the step's `MambaStep` in `AttentionMetadata.aux`


@dataclass
class ScanGroup:
    """Sequences scanned together (`ssd.ScanGroup`), the index tensors on the device."""

    counts: list[int]
    num_chunks: int
    slots: torch.Tensor  # int64 [Sg] their state slots
    tokens: torch.Tensor  # int64 [Tg]
    rows: torch.Tensor  # int64 [Tg]
    chunk_of: torch.Tensor  # int64 [Tg]
    in_chunk: torch.Tensor  # int64 [Tg]
    # prefix caching: the packed chunks whose start states are saved, into these entries
    # (sorted by chunk); on the host, the chunk positions they fall in: the first packed chunk
    # of each such position -> their slice of the two (Mamba-1's scan, position by position)
    snap_chunks: torch.Tensor | None = None
    snap_entries: torch.Tensor | None = None
    snap_runs: dict[int, tuple[int, int]] | None = None


@dataclass
class Prefill:
    """A step's prefill chunks in the packed layout (`ssd.pack`; `Mamba2Mixer._prefill`), the
    index tensors on the device."""

    conv_len: int
    slots: torch.Tensor  # int64 [S]: the sequences' state slots, sorted as the scan's layout
    conv_rows: torch.Tensor  # int64 [T]
    conv_out: torch.Tensor  # int64 [T]
    state_rows: torch.Tensor  # int64 [S * (d_conv - 1)]
    end_rows: torch.Tensor  # int64 [S * (d_conv - 1)]
    groups: list[ScanGroup]
    # prefix caching: the conv rows before each boundary inside a chunk [M * (d_conv - 1)],
    # and the snapshot entries they go to [M]
    snap_conv_rows: torch.Tensor | None = None
    snap_conv_entries: torch.Tensor | None = None
    # the same boundaries as int64 [3, M] (prefill sequence, offset in its chunk, entry):
    # Qwen4-Exp's PLE conv (`qwen4_exp.Ple`) keeps inputs of its own there
    snap_mid: torch.Tensor | None = None


@dataclass
class MambaStep:
    """What the Mamba layers of one step read besides their input (built by the runner)."""

    slots: torch.Tensor  # int64 [B] each sequence's state slot, on the device
    num_decodes: int  # the first sequences, one token each
    # layer -> its (conv [slots, conv_dim, d_conv - 1], SSM [slots, H, P, N]) state slots
    states: dict[int, tuple[torch.Tensor, torch.Tensor]]
    decode_run: tuple[int, int] | None = None  # the decode rows' slots, when they are a..b - 1
    prefill: Prefill | None = None  # the prefill chunks (rows after the decodes)
    # prefix caching (`worker/mamba_state.py`): layer -> its snapshot entries (as `states`),
    # on a step that saves some; (slots, entries) whose state is saved after the layer's step
    snaps: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None
    save_end: tuple[torch.Tensor, torch.Tensor] | None = None


def save_chunk_ends(step: MambaStep, index: int) -> None:
    """Prefix caching: layer `index`'s states left in the slots of the sequences whose chunk
    ends on a snapshot boundary (`step.save_end`), copied to their entries (every recurrent
    mixer's; the short conv's empty SSM state copies nothing)."""
    if step.save_end is None:
        return
    slots, entries = step.save_end
    for state, snap in zip(step.states[index], step.snaps[index], strict=True):
        snap.index_copy_(0, entries, state.index_select(0, slots))


def scan_bytes(mc: ModelConfig, tokens: int, seqs: int, tp: int = 1) -> int:
    """A hybrid's chunked-scan temporaries for a step of `tokens` prefill tokens in at most
    `seqs` sequences (0 without Mamba layers) on one of `tp` ranks (its heads and groups:
    `mamba_shard.local`): what the CUDA runner keeps free beside its activations' headroom,
    the fit check and the memory estimate count (`step_scan_bytes`)."""
    m = mamba_shard.local(mc.family.mamba, tp)
    if m is None or m.mixer == "short_conv":  # (LFM2's short convs: no scan)
        return 0
    if m.mixer == "gated_deltanet":  # Qwen3-Next's (`gated_delta.prefill`)
        from pagoda.runtime.model.gated_delta import prefill_bytes

        return prefill_bytes(tokens, m.n_heads, m.d_state, m.head_dim, m.chunk_size)
    if m.mixer == "kda":  # Kimi Linear's (`kda.chunked`: a decay per key channel)
        from pagoda.runtime.model.kda import prefill_bytes as kda_bytes

        return kda_bytes(tokens, m.n_heads, m.d_state, m.head_dim, m.chunk_size)
    if m.mixer in (
        "mamba1",
        "rglru",
        "wkv",
        "mlstm",
    ):  # `mamba1.scan_by_position` (the RG-LRU's, less):
        # eight float32 [T, d_inner] (its inputs packed, ...), the states, a block of decays
        # and inputs (`BLOCK_ELEMENTS` each)
        return (8 * tokens + 3 * seqs * m.d_state) * m.d_inner * 4 + 2 * (1 << 22) * 4
    return ssd_scan_bytes(tokens, seqs, m.n_heads, m.head_dim, m.d_state, m.n_groups,
                          m.chunk_size)  # fmt: skip


def step_scan_bytes(mc: ModelConfig, sched, tp: int = 1) -> int:
    """`scan_bytes` of the engine's largest step on one of `tp` ranks:
    ``max_num_batched_tokens`` prefill tokens in up to ``max_num_seqs`` sequences
    (`config.SchedulerConfig`)."""
    return scan_bytes(mc, sched.max_num_batched_tokens, sched.max_num_seqs, tp)


def recurrent_step(
    state: torch.Tensor,  # [S, H, P, N] float32
    x: torch.Tensor,  # [S, H, P] float32
    dt: torch.Tensor,  # [S, H] float32, softplus'd and clamped
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [S, G, N]
    C: torch.Tensor,  # [S, G, N]
    D: torch.Tensor,  # [H]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of S sequences: (y [S, H, P], the new state) (transformers'
    `mamba2_selective_state_update`). `state` is a gathered copy: updated in place. The heads
    of a group share its B and C (broadcast, not repeated)."""
    S, H, P, N = state.shape
    G = B.shape[1]
    grouped = (S, G, H // G)
    new = state.view(*grouped, P, N)
    new.mul_(torch.exp(dt * A).view(*grouped, 1, 1))
    new.addcmul_((dt[..., None] * x).view(*grouped, P, 1), B.float().view(S, G, 1, 1, N))
    y = torch.matmul(new, C.float().view(S, G, 1, N, 1)).view(S, H, P) + x * D[:, None]
    return y, state


def conv_step(
    conv_state: torch.Tensor,  # [S, C, K - 1]
    x: torch.Tensor,  # [S, C]
    weight: torch.Tensor,  # [C, K]
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the causal conv for S sequences: (SiLU(conv) [S, C], the new state)."""
    window = torch.cat([conv_state, x[..., None]], dim=-1)  # [S, C, K]
    out = (window * weight).sum(-1)
    if bias is not None:
        out = out + bias
    return F.silu(out), window[..., 1:]


def packed_conv(
    conv: torch.Tensor,  # [slots, C, K - 1] the layer's conv states
    x: torch.Tensor,  # [T, C] the prefill chunks' conv inputs
    pre: Prefill,
    weight: torch.Tensor | None,  # [C, K] (None with `conv_fn`)
    bias: torch.Tensor | None,
    snap: torch.Tensor | None = None,  # [entries, C, K - 1] prefix-cache snapshots' conv states
    conv_fn=None,  # [1, C, L] -> [1, C, L - K + 1]: a conv of its own (Zaya's), else `weight`'s
) -> torch.Tensor:
    """The causal conv [T, C] (no activation) of a step's prefill chunks, all at once over each
    sequence's segment (its conv state, then its tokens: `ssd.pack`); the new conv states (each
    segment's last K - 1 inputs) written to their slots, and with `snap` the conv states at the
    snapshot boundaries inside the chunks (``pre.snap_conv_rows``) to theirs. The Mamba2 mixer's,
    LFM2's short conv's, the Mamba-1 mixer's and (its own convs: `conv_fn`) Zaya's q/k."""
    k, n_seq, c = conv.shape[2], pre.slots.shape[0], x.shape[1]
    window = x.new_empty(pre.conv_len, c).index_copy_(0, pre.conv_rows, x)
    start = conv.index_select(0, pre.slots).transpose(1, 2).reshape(n_seq * k, c)
    window.index_copy_(0, pre.state_rows, start.to(window.dtype))
    new = window.index_select(0, pre.end_rows).view(n_seq, k, c).transpose(1, 2)
    conv.index_copy_(0, pre.slots, new.to(conv.dtype))
    if snap is not None:  # the conv inputs before boundaries inside chunks
        at = window.index_select(0, pre.snap_conv_rows).view(-1, k, c)
        snap.index_copy_(0, pre.snap_conv_entries, at.transpose(1, 2).to(conv.dtype))
    if conv_fn is not None:
        out = conv_fn(window.t()[None])[0]
    else:
        out = F.conv1d(window.t()[None], weight[:, None, :], bias, groups=c)[0]
    del window
    return out.index_select(1, pre.conv_out).t()


def _group_norm(h: torch.Tensor, group: int, eps: float, spread=None) -> torch.Tensor:
    """RMSNorm over groups of `group` channels; `spread`: (the tensor-parallel group, the ranks
    one group spans) where this rank holds a part of its one group (`mamba_shard.py`): the
    sums of squares of those ranks' parts added."""
    if spread is None:
        g = h.view(*h.shape[:-1], -1, group)
        return (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)).view(h.shape)
    tp, ranks = spread
    sums = tp.gather_columns(h.pow(2).sum(-1, keepdim=True))  # [T, tp size]
    first = tp.rank // ranks * ranks
    total = sums[:, first : first + ranks].sum(-1, keepdim=True)
    return h * torch.rsqrt(total / group + eps)


def gated_rms_norm(
    y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group: int, eps: float, spread=None
) -> torch.Tensor:
    """weight * RMSNorm(y * SiLU(z)) over groups of `group` channels, in float32, rounded to
    the input's dtype before the weight (transformers' `MambaRMSNormGated`)."""
    h = y.float() * F.silu(z.float())
    return weight * _group_norm(h, group, eps, spread).to(y.dtype)


def norm_then_gate(
    y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group: int, eps: float, spread=None
) -> torch.Tensor:
    """weight * RMSNorm(y) * SiLU(z), in float32, rounded once (Falcon-H1's
    `norm_before_gate`)."""
    h = _group_norm(y.float(), group, eps, spread)
    return (weight * h * F.silu(z.float())).to(y.dtype)


def _projections(ctx, w, p: str, s: mamba_shard.MambaShard):
    """in_proj (this rank's rows of its z, x, B, C and dt parts) and out_proj (row-parallel:
    this rank's heads' columns, summed over the ranks)."""
    name = p + "in_proj.weight"
    if ctx.tp is None:
        return linear_layer(ctx, w, [name]), linear_layer(ctx, w, [p + "out_proj.weight"])
    return (column_linear(ctx, w, [name] * 5, s.in_proj_rows()),
            row_linear(ctx, w, p + "out_proj.weight"))  # fmt: skip


def _rows(w, name: str, parts: list[tuple[int, int]], tp) -> torch.Tensor:
    """Rows `parts` of tensor `name`, joined (all of it for one rank)."""
    return w[name] if tp is None else torch.cat([w.part(name, 0, *r) for r in parts])


class Mamba2Mixer:
    """One Mamba2 layer's weights and forward (module docstring)."""

    def __init__(self, m: MambaConfig, w, prefix: str, index: int, eps: float, ctx) -> None:
        """`w`: the model's `DeviceWeights`; `ctx`: its `LayerContext` (with a tensor-parallel
        group, this rank's heads and groups: `mamba_shard.py`)."""
        tp = ctx.tp
        s = mamba_shard.shard(m, None if tp is None else tp.layout)
        self.m, self.index, self.eps = s.local, index, eps
        self.tp, self.norm_ranks, self.group = tp, s.norm_ranks, m.d_inner // m.n_groups
        p = prefix + "mamba."
        self.in_proj, self.out_proj = _projections(ctx, w, p, s)

        def read(name: str, parts: list[tuple[int, int]]) -> torch.Tensor:
            return _rows(w, p + name, parts, tp)

        self.conv_weight = read("conv1d.weight", s.conv_rows())[:, 0, :].contiguous()  # [C, K]
        self.conv_bias = read("conv1d.bias", s.conv_rows()) if m.conv_bias else None
        # float32 as transformers computes with them (A = -exp(A_log.float()))
        self.A = -torch.exp(read("A_log", [s.heads]).float())
        self.D = read("D", [s.heads]).float()
        self.dt_bias = read("dt_bias", [s.heads])
        self.norm = read("norm.weight", [s.head_channels()]) if m.gated_norm else None
        # the CPU's native recurrence for float32 states (`cpu/mamba_step.py`), else torch's
        self.native = mamba_step.load(recurrent_step) if w.device.type == "cpu" else None
        self.clamp = (m.dt_min, m.dt_max) != (0.0, float("inf"))
        # Falcon-H1's µP multipliers: on the input, and on in_proj's z, x, B, C and dt parts
        f = m.falcon
        self.in_scale = f.ssm_in if f is not None and f.ssm_in != 1.0 else None
        self.mup = None
        if f is not None and any(x != 1.0 for x in f.zxbcdt):
            sizes = [b - a for a, b in s.in_proj_rows()]
            self.mup = torch.cat([torch.full((n,), x, dtype=self.A.dtype, device=self.A.device)
                                  for n, x in zip(sizes, f.zxbcdt)]).to(self.dt_bias.dtype)  # fmt: skip

    def linears(self) -> list:
        return [self.in_proj, self.out_proj]

    def _dt(self, dt: torch.Tensor) -> torch.Tensor:
        dt = F.softplus((dt + self.dt_bias.to(dt.dtype)).float())
        return dt.clamp(self.m.dt_min, self.m.dt_max) if self.clamp else dt

    def __call__(self, h: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]; the layer's states updated in place at the step's
        slots."""
        m = self.m
        states = step.states[self.index]
        t = h.shape[0]
        zxbcdt = self.in_proj(h if self.in_scale is None else h * self.in_scale)
        if self.mup is not None:
            zxbcdt = zxbcdt * self.mup
        z, xbc, dt = zxbcdt.split([m.d_inner, m.conv_dim, m.n_heads], dim=-1)
        dt = self._dt(dt)
        conv, ssm = states
        y = torch.empty(t, m.n_heads, m.head_dim, dtype=torch.float32, device=h.device)
        nd = step.num_decodes
        if nd:
            y[:nd] = self._decode(conv, ssm, xbc[:nd], dt[:nd], step)
        if step.prefill is not None:
            snaps = None if step.snaps is None else step.snaps[self.index]
            y[nd:] = self._prefill(conv, ssm, xbc[nd:], dt[nd:], step.prefill, snaps)
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        return self.out_proj(self._output(y.view(t, m.d_inner), z, h.dtype))

    def _output(self, y: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The scan's output [T, d_inner] (float32) gated by z and normalised, in `dtype`."""
        m = self.m
        if self.norm is None:  # Falcon-H1 without `mamba_rms_norm`: the gate alone
            return (y * F.silu(z.float())).to(dtype)
        spread = (self.tp, self.norm_ranks) if self.norm_ranks > 1 else None
        if m.norm_before_gate:
            return norm_then_gate(y, z, self.norm, self.group, self.eps, spread).to(dtype)
        return gated_rms_norm(y.to(dtype), z, self.norm, self.group, self.eps, spread)

    def _decode(self, conv, ssm, xbc: torch.Tensor, dt: torch.Tensor, step: MambaStep):
        """The decode rows' one recurrence step: on the CPU with float32 states, the native
        loop in the slots themselves; else their states gathered from their slots and scattered
        back, or, where the slots are one run (steady decoding: sequences admitted together
        keep consecutive slots) and the SSM state float32, updated in place there."""
        nd = xbc.shape[0]
        run = step.decode_run
        slots = step.slots[:nd]
        conv_in = conv[run[0] : run[1]] if run else conv.index_select(0, slots)
        c, new_conv = conv_step(conv_in, xbc, self.conv_weight, self.conv_bias)
        if run:
            conv_in.copy_(new_conv)
        else:
            conv.index_copy_(0, slots, new_conv.to(conv.dtype))
        x, B, C = self._split(c)
        if self.native is not None and ssm.dtype == torch.float32:  # one pass, in the slots
            return self.native(ssm, slots, x, dt, self.A, B, C, self.D)
        in_place = run is not None and ssm.dtype == torch.float32
        state = ssm[run[0] : run[1]] if in_place else ssm.index_select(0, slots).float()
        y, state = recurrent_step(state, x.float(), dt, self.A, B, C, self.D)
        if not in_place:
            ssm.index_copy_(0, slots, state.to(ssm.dtype))
        return y

    def _prefill(self, conv, ssm, xbc: torch.Tensor, dt: torch.Tensor, pre: Prefill, snaps=None):
        """The step's prefill chunks, all at once (`ssd`'s packed layout): the causal conv over
        each sequence's segment (its conv state, then its tokens), the chunked scan from each
        one's SSM state; both states left in their slots, the outputs in the step's rows.
        `snaps`: the layer's snapshot entries, where the step saves states inside its chunks."""
        m = self.m
        snap = None if pre.snap_conv_rows is None else snaps[0]
        xbc = packed_conv(conv, xbc, pre, self.conv_weight, self.conv_bias, snap)
        x, B, C = self._split(F.silu(xbc))
        y = ssd.scan_step(x, dt, self.A, B, C, ssm, pre.groups, m.chunk_size,
                          None if snap is None else snaps[1])  # fmt: skip
        return y + x.float() * self.D[:, None]

    def _split(self, xbc: torch.Tensor):
        m = self.m
        gn = m.n_groups * m.d_state
        x, B, C = xbc.split([m.d_inner, gn, gn], dim=-1)
        s = xbc.shape[0]
        return (x.reshape(s, m.n_heads, m.head_dim), B.reshape(s, m.n_groups, m.d_state),
                C.reshape(s, m.n_groups, m.d_state))  # fmt: skip
