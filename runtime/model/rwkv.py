"""RWKV-4 (`RwkvForCausalLM`: RWKV/rwkv-4-169m-pile to 14b, rwkv-raven; config read in
`rwkv_config.py`): each layer ``x + time_mix(ln1(x))``, then ``+ channel_mix(ln2(x))``
(LayerNorms with biases; the first layer's input normalised by `pre_ln` first), no attention:

- the time-mix (`TimeMix`): each token's input mixed with the one before it (the token shift,
  by the learned `time_mix_*`) into key k, value v and receptance r; the wkv recurrence per
  channel, with decay w = -exp(time_decay) and bonus u = time_first, kept stable by a running
  maximum (transformers' `rwkv_linear_attention_cpu`, float32):

      wkv_t = (e^{p-q} num + e^{k_t+u-q} v_t) / (e^{p-q} den + e^{k_t+u-q}),  q = max(p, k_t+u)
      num, den, p <- e^{p+w-q'} num + e^{k_t-q'} v_t,  e^{p+w-q'} den + e^{k_t-q'},  q'
                      (q' = max(p + w, k_t))

  then output(sigmoid(r) * wkv);
- the channel-mix (`ChannelMix`): shifted the same way, value(relu(key(x))²) * sigmoid(r).

Each sequence keeps per layer, in the hybrids' state slots (`worker/mamba_state.py`,
`MambaConfig.mixer` "wkv"), the two mixes' previous inputs (the conv state's one column: rows
[0, hidden) the time-mix's, [hidden, 2 hidden) the channel-mix's) and num, den, p (the SSM
slot [1, attention_hidden_size, 3], float32; a zeroed slot reads as transformers' start, p at
-1e38, since num and den are zero). The decode rows are one batched step over their slots; the
prefill chunks shift through `mamba2.packed_conv` (a conv that picks the input before) and run
the recurrence position by position over `ssd.pack`'s position-major layout (Mamba-1's: one
torch step per position of the step's longest chunk, over every sequence still running at it;
no per-sequence loop). Prefix caching keeps snapshots every block (`engine/recurrent.py`).
Tensor parallel by channels of the time-mix (N must divide attention_hidden_size,
`distributed/layout.mamba_problem`): a rank's rows of key, value and receptance, its decay,
bonus and wkv state (`MambaConfig.on_ranks`), output row-parallel; the token shifts whole on
every rank (their inputs are); the channel-mix's key by rows, value row-parallel, receptance
whole. 16 or 32 bits (`family_options.py`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step, linear_layer
from pagoda.runtime.model.mamba1 import scan_by_position
from pagoda.runtime.model.mamba2 import MAMBA_STEP, MambaStep, packed_conv, save_chunk_ends
from pagoda.runtime.model.parallel_linear import column_linear, row_linear
from pagoda.runtime.model.starcoder2 import Starcoder2Model, layer_norm


def _previous(t: torch.Tensor) -> torch.Tensor:
    """`packed_conv`'s conv of width 2 that keeps the input before each token."""
    return t[..., :-1]


def token_shift(
    conv: torch.Tensor,  # [slots, C, 1]: this mix's rows of the layer's conv states
    snap: torch.Tensor | None,  # [entries, C, 1]: theirs in the prefix-cache snapshots
    x: torch.Tensor,  # [T, C]
    step: MambaStep,
) -> torch.Tensor:
    """Each token's input before it [T, C] (its sequence's, or its slot's for the first token
    of a chunk); the last inputs written to the slots."""
    nd, prev = step.num_decodes, torch.empty_like(x)
    if nd:
        run = step.decode_run
        if run:
            prev[:nd] = conv[run[0] : run[1], :, 0]
            conv[run[0] : run[1], :, 0] = x[:nd]
        else:
            slots = step.slots[:nd]
            prev[:nd] = conv.index_select(0, slots)[..., 0]
            conv.index_copy_(0, slots, x[:nd, :, None].to(conv.dtype))
    pre = step.prefill
    if pre is not None:
        snap = None if pre.snap_conv_rows is None else snap
        prev[nd:] = packed_conv(conv, x[nd:], pre, None, None, snap, conv_fn=_previous)
    return prev


def wkv_step(
    state: torch.Tensor,  # [S, A, 3] float32 (num, den, p), updated in place
    k: torch.Tensor,  # [S, A] float32
    v: torch.Tensor,  # [S, A] float32
    w: torch.Tensor,  # [A] float32: -exp(time_decay)
    u: torch.Tensor,  # [A] float32: time_first
) -> torch.Tensor:
    """One token of S sequences: wkv [S, A] (module docstring)."""
    num, den, p = state.unbind(-1)
    q = torch.maximum(p, k + u)
    e1, e2 = torch.exp(p - q), torch.exp(k + u - q)
    out = (e1 * num + e2 * v) / (e1 * den + e2)
    q2 = torch.maximum(p + w, k)
    e1, e2 = torch.exp(p + w - q2), torch.exp(k - q2)
    state.copy_(torch.stack([e1 * num + e2 * v, e1 * den + e2, q2], dim=-1))
    return out


def _in_out(ctx, w: DeviceWeights, into: list[str], out: str) -> tuple[list, object]:
    """The layers of the matrices `into` (one each; column-parallel over ranks: this rank's
    channels) and of `out` (row-parallel: its input columns, summed over the ranks)."""
    if ctx.tp is None:
        return [linear_layer(ctx, w, [n]) for n in into], linear_layer(ctx, w, [out])
    return [column_linear(ctx, w, [n]) for n in into], row_linear(ctx, w, out)


class TimeMix:
    """One layer's time-mix (module docstring); on a tensor-parallel rank its channels of k, v,
    r, the decay, the bonus and the wkv state, output's input columns."""

    def __init__(self, w: DeviceWeights, p: str, index: int, hidden: int, ctx) -> None:
        a = p + "attention."
        self.index, self.hidden = index, hidden
        names = [f"{a}{n}.weight" for n in ("key", "value", "receptance")]
        (self.key, self.value, self.receptance), self.output = _in_out(
            ctx, w, names, a + "output.weight"
        )
        mix = [w[f"{a}time_mix_{n}"].reshape(hidden) for n in ("key", "value", "receptance")]
        self.mix = torch.stack(mix)  # [3, hidden]: the inputs are whole on every rank
        channels = (0, w.length(a + "time_decay", 0))
        if ctx.tp is not None:
            channels = ctx.tp.layout.even(channels[1])
        self.decay = -torch.exp(w.part(a + "time_decay", 0, *channels).float())
        self.bonus = w.part(a + "time_first", 0, *channels).float()

    def linears(self) -> list:
        return [self.key, self.value, self.receptance, self.output]

    def __call__(self, x: torch.Tensor, step: MambaStep) -> torch.Tensor:
        conv, ssm = step.states[self.index]
        snap = step.snaps[self.index][0][:, : self.hidden] if step.snaps else None
        prev = token_shift(conv[:, : self.hidden], snap, x, step)
        xk, xv, xr = (x * m + prev * (1 - m) for m in self.mix)
        k, v = self.key(xk).float(), self.value(xv).float()
        r = torch.sigmoid(self.receptance(xr))
        out = torch.empty_like(k)
        nd = step.num_decodes
        if nd:
            run = step.decode_run
            state = ssm[run[0] : run[1]] if run else ssm.index_select(0, step.slots[:nd])
            out[:nd] = wkv_step(state[:, 0], k[:nd], v[:nd], self.decay, self.bonus)
            if not run:
                ssm.index_copy_(0, step.slots[:nd], state)
        if step.prefill is not None:
            out[nd:] = self._scan(ssm, k[nd:], v[nd:], step)
        return self.output(r * out.to(r.dtype))

    def _scan(self, ssm, k: torch.Tensor, v: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """The prefill chunks' WKV recurrence (`mamba1.scan_by_position`)."""

        def advance(s, off, n, packed):
            return wkv_step(s[:, 0], packed[0][off : off + n], packed[1][off : off + n],
                            self.decay, self.bonus)  # fmt: skip

        return scan_by_position(ssm, (k, v), step, self.index, advance, out=1)


class ChannelMix:
    """One layer's channel-mix (module docstring); on a tensor-parallel rank its rows of key,
    value's input columns (summed before the gate), receptance whole (its gate multiplies the
    sum)."""

    def __init__(self, w: DeviceWeights, p: str, index: int, hidden: int, ctx) -> None:
        f = p + "feed_forward."
        self.index, self.hidden = index, hidden
        (self.key,), self.value = _in_out(ctx, w, [f + "key.weight"], f + "value.weight")
        self.receptance = linear_layer(ctx, w, [f + "receptance.weight"])
        mix = [w[f"{f}time_mix_{n}"].reshape(hidden) for n in ("key", "receptance")]
        self.mix = torch.stack(mix)  # [2, hidden]

    def linears(self) -> list:
        return [self.key, self.receptance, self.value]

    def __call__(self, x: torch.Tensor, step: MambaStep) -> torch.Tensor:
        conv = step.states[self.index][0][:, self.hidden : 2 * self.hidden]
        snap = step.snaps[self.index][0][:, self.hidden : 2 * self.hidden] if step.snaps else None
        prev = token_shift(conv, snap, x, step)
        xk, xr = (x * m + prev * (1 - m) for m in self.mix)
        return torch.sigmoid(self.receptance(xr)) * self.value(torch.relu(self.key(xk)).square())


class RwkvLayer(LlamaLayer):
    """x + time_mix(ln1(x)), then + channel_mix(ln2(x)) (module docstring); the residual adds
    fused into the LayerNorms, as Llama's into its norms."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        h = model.config.hidden_size
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        self.pre_norm = model.read_norm(w, prefix + "pre_ln.weight") if index == 0 else None
        self.mixer = TimeMix(w, prefix, index, h, ctx)
        self.channel = ChannelMix(w, prefix, index, h, ctx)

    def linears(self):
        return [*self.mixer.linears(), *self.channel.linears()]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m, eps = step.meta.aux[MAMBA_STEP], self.ctx.eps
        if self.pre_norm is not None:  # the first layer: the embeddings normalised first
            h = layer_norm(x=h, weight=self.pre_norm, eps=eps)
        x, residual = self.attention_input(h, residual)
        h = self.mixer(x, m)
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=eps, residual=residual)
        out = self.channel(x, m)
        save_chunk_ends(m, self.index)  # prefix caching: boundaries at a chunk's end
        return out, residual


class RwkvModel(Starcoder2Model):
    """LayerNorms with biases (`starcoder2.Starcoder2Model`'s), RWKV's layers."""

    layer_class = RwkvLayer
