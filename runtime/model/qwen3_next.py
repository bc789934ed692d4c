"""Qwen3-Next (`Qwen3NextForCausalLM`) and Qwen3.5's text models (`Qwen3_5ForCausalLM`,
`Qwen3_5MoeForCausalLM`, and the text model of `Qwen3_5ForConditionalGeneration` /
`Qwen3_5MoeForConditionalGeneration`; configs read in `qwen3_next_config.py`): hybrids whose
`layer_types` mix

- Gated DeltaNet layers (`GatedDeltaNet`, transformers' `Qwen3NextGatedDeltaNet`): one
  projection gives q, k, v (a causal depthwise conv of width ``linear_conv_kernel_dim`` and
  SiLU over them), the output gate z, b (beta = sigmoid(b)) and a (the decay g = -exp(A_log)
  softplus(a + dt_bias)); q and k L2-normalised, the gated delta rule (`gated_delta.py`) per
  value head (a key head serves ``num_v_heads / num_k_heads`` of them), its output normalised
  per head and gated (weight * RMSNorm(o) * SiLU(z): `Qwen3NextRMSNormGated`), out_proj.
  Qwen3-Next stores the projection as `in_proj_qkvz` and `in_proj_ba`, interleaved by key
  head; Qwen3.5 as `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`: both are read into one
  matrix [q, k, v, z, b, a] at load (llama.cpp's Qwen3-Next GGUFs as `in_proj_qkv`, `in_proj_z`
  and `in_proj_ba`: `gguf_qwen3next`);
- gated attention (`Qwen3NextAttention`): q_proj gives each head's query and an output gate
  (interleaved per head, split at load), q and k normalised per head (RMSNorm, (1 + w)), a
  partial rotary (the first quarter of each head by default), attention's output times
  sigmoid(gate) before o_proj.

Every norm but the gated one is zero-centred, (1 + w) (Gemma's: `gemma2.Gemma2Model`'s
`norm_weight`). The MLP is SwiGLU (Qwen3.5) or, where `FamilyConfig.moe_layers` says,
softmax-routed experts beside a shared expert gated by a sigmoid (`moe.SharedExpertMoE`,
Qwen2-MoE's; Qwen3.5-MoE always renormalises the top-k).

The DeltaNet layers keep, per sequence, a conv state [conv_dim, kernel - 1] and a float32
state [v_heads, key_dim, value_dim] in the hybrids' state slots (`worker/mamba_state.py`,
`MambaConfig.mixer` "gated_deltanet"); the step's slots and packed prefill layout come as the
Mamba2 layers' do (`mamba2.MambaStep`). Prefix caching keeps snapshots of both states every
lcm(block size, 64) tokens as for the Mamba2 layers (`core/state_snapshots.py`: the chunked
rule's chunk start states, or the slots' at a step's chunk end); tensor parallelism splits them by key heads (`GatedDeltaNet`; N must
divide them: `distributed/layout.py`); FP8 is refused (`engine/start_checks.check_dtype`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model import gated_delta, mamba_shard
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gemma2 import Gemma2Model
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.mamba2 import MambaStep, conv_step, packed_conv, save_chunk_ends
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import gemma_rms_norm
from pagoda.runtime.model.parallel_linear import row_linear
from pagoda.runtime.model.qwen3 import GatedQuery, Qwen3Layer
from pagoda.runtime.model.qwen3_next_config import STACKED
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig


def _in_proj(m: MambaConfig, w: DeviceWeights, p: str) -> torch.Tensor:
    """The rows of q, k, v, z, b and a in that order (module docstring): Qwen3.5's four
    projections stacked, or Qwen3-Next's two taken apart by key head."""
    dk, dv, hk = m.d_state, m.head_dim, m.n_groups
    r = m.n_heads // hk  # value heads per key head
    if p + "in_proj_qkv.weight" in w:
        qkvz = [w[p + f"in_proj_{x}.weight"] for x in ("qkv", "z")]
        if p + "in_proj_ba.weight" in w:  # llama.cpp's Qwen3-Next: qkv and z apart, ba as stored
            b, a = w[p + "in_proj_ba.weight"].view(hk, 2 * r, -1).split([r, r], dim=1)
            return torch.cat([*qkvz, b.reshape(-1, b.shape[-1]), a.reshape(-1, a.shape[-1])])
        return torch.cat([*qkvz, w[p + "in_proj_b.weight"], w[p + "in_proj_a.weight"]])
    qkvz = w[p + "in_proj_qkvz.weight"].view(hk, 2 * dk + 2 * r * dv, -1)
    q, k, v, z = qkvz.split([dk, dk, r * dv, r * dv], dim=1)
    b, a = w[p + "in_proj_ba.weight"].view(hk, 2 * r, -1).split([r, r], dim=1)
    return torch.cat([t.reshape(-1, t.shape[-1]) for t in (q, k, v, z, b, a)])


def _rank_rows(s: mamba_shard.MambaShard) -> list[tuple[int, int]]:
    """A rank's rows of the [q, k, v, z, b, a] matrix (`_in_proj`): the q and k of its key
    heads, the v, z, b and a of its value heads (the first three: its conv channels)."""
    m, (h0, h1), (g0, g1) = s.full, s.heads, s.groups
    kd, dk, dv, c, d = m.n_groups * m.d_state, m.d_state, m.head_dim, m.conv_dim, m.d_inner
    return [(g0 * dk, g1 * dk), (kd + g0 * dk, kd + g1 * dk), (2 * kd + h0 * dv, 2 * kd + h1 * dv),
            (c + h0 * dv, c + h1 * dv), (c + d + h0, c + d + h1),
            (c + d + m.n_heads + h0, c + d + m.n_heads + h1)]  # fmt: skip


class GatedDeltaNet:
    """One Gated DeltaNet layer's weights and forward (module docstring). With tensor
    parallelism a rank holds key heads [r G/N, (r+1) G/N) and the value heads they serve
    (`mamba_shard.shard`): its rows of the projection and channels of the conv, its A, dt_bias
    and state slots; out_proj row-parallel (one all-reduce). OLMo Hybrid's layer
    (`olmo_hybrid.py`) names its output projection and gated norm otherwise."""

    out_name, norm_name = "out_proj.weight", "norm.weight"
    norm_rounded = True  # RMSNorm(o) rounded before its weight (LaraMini's: float32 throughout)
    # the delta rule's decode step and chunked prefill (Kimi Linear's KDA: `kda.py`'s)
    step_rule = staticmethod(gated_delta.recurrent_step)
    chunk_rule = staticmethod(gated_delta.chunked)

    def in_proj_weight(self, m: MambaConfig, w: DeviceWeights, p: str) -> torch.Tensor:
        """The rows of q, k, v, z, b and a in that order (`_in_proj`)."""
        return _in_proj(m, w, p)

    def conv_weight_of(self, w: DeviceWeights, p: str) -> torch.Tensor:
        return w[p + "conv1d.weight"]

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, eps, ctx):
        p = prefix + "linear_attn."
        s = mamba_shard.shard(m, None if ctx.tp is None else ctx.tp.layout)
        self.m, self.index, self.eps = s.local, index, eps
        # beta in [0, 2] where negative eigenvalues are allowed (OLMo Hybrid's), else [0, 1]
        self.beta_scale = 2.0 if m.allow_neg_eigval else 1.0
        in_proj, conv = self.in_proj_weight(m, w, p), self.conv_weight_of(w, p)[:, 0, :]  # [C, K]
        heads = slice(*s.heads)
        if ctx.tp is not None:  # this rank's rows and channels
            rows = _rank_rows(s)
            in_proj = torch.cat([in_proj[a:b] for a, b in rows])
            conv = torch.cat([conv[a:b] for a, b in rows[:3]])
        self.in_proj = ctx.linear(in_proj.contiguous())
        self.out_proj = row_linear(ctx, w, p + self.out_name)
        self.conv_weight = conv.contiguous()
        self.A = -torch.exp(w.source(p + "A_log")[heads].float()).to(w.device)  # float32 [H]
        self.dt_bias = w[p + "dt_bias"][heads]
        self.norm = w[p + self.norm_name]  # [value_dim]: weight * norm (not 1 + w)
        m = s.local
        self.scale = m.d_state**-0.5
        self.sizes = [m.conv_dim, m.d_inner, m.n_heads, m.n_heads]

    # the prefill's conv where it is not `conv_weight`'s in the inputs' dtype (`packed_conv`'s
    # `conv_fn`: BailingHybrid's float32 conv, model/bailing_hybrid.py)
    conv_fn = None

    def linears(self) -> list:
        return [self.in_proj, self.out_proj]

    def __call__(self, h: torch.Tensor, step: MambaStep) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]; the layer's states updated at the step's slots."""
        m, t = self.m, h.shape[0]
        conv, state = step.states[self.index]
        qkv, z, g, beta = self.inputs(h)
        o = torch.empty(t, m.n_heads, m.head_dim, dtype=torch.float32, device=h.device)
        nd = step.num_decodes
        if nd:
            o[:nd] = self._decode(conv, state, qkv[:nd], g[:nd], beta[:nd], step)
        if step.prefill is not None:
            pre = step.prefill
            snaps = None if step.snaps is None else step.snaps[self.index]
            snap = None if pre.snap_conv_rows is None else snaps
            x = packed_conv(conv, qkv[nd:], pre, self.conv_weight, None,
                            None if snap is None else snap[0], self.conv_fn)  # fmt: skip
            o[nd:] = gated_delta.prefill(*self._qkv(F.silu(x)), g[nd:], beta[nd:], state,
                                         pre.groups, m.chunk_size,
                                         None if snap is None else snap[1],
                                         rule=self.chunk_rule)  # fmt: skip
        save_chunk_ends(step, self.index)  # prefix caching: boundaries at a chunk's end
        return self.out_proj(self._output(o.to(h.dtype), z))

    def inputs(self, h: torch.Tensor):
        """(the conv's input q k v, the output gate z, the log decay g, beta) of rows `h`."""
        qkv, z, b, a = self.in_proj(h).split(self.sizes, dim=-1)
        beta = torch.sigmoid(b).float()
        if self.beta_scale != 1.0:  # (exact: the 16-bit sigmoid doubled, as transformers')
            beta = beta * self.beta_scale
        return qkv, z, self.A * F.softplus(a.float() + self.dt_bias), beta

    def _decode(self, conv, state, qkv: torch.Tensor, g, beta, step: MambaStep) -> torch.Tensor:
        """The decode rows' one conv and delta-rule step: their states gathered from their
        slots and scattered back, or, where the slots are one run (steady decoding: sequences
        admitted together keep consecutive slots), updated in place there."""
        nd, run = qkv.shape[0], step.decode_run
        slots = step.slots[:nd]
        x, new_conv = conv_step(conv[run[0] : run[1]] if run else conv.index_select(0, slots),
                                qkv, self.conv_weight, None)  # fmt: skip
        if run:
            conv[run[0] : run[1]] = new_conv
        else:
            conv.index_copy_(0, slots, new_conv.to(conv.dtype))
        in_place = run is not None and state.dtype == torch.float32
        s = state[run[0] : run[1]] if in_place else state.index_select(0, slots).float()
        o = self.step_rule(s, *self._qkv(x), g, beta)
        if not in_place:
            state.index_copy_(0, slots, s.to(state.dtype))
        return o

    def _qkv(self, x: torch.Tensor):
        """q (normalised, scaled), k (normalised) [S, H, K] float32, each key head repeated
        for its value heads; v [S, H, V] float32."""
        m, s = self.m, x.shape[0]
        q, k, v = x.float().split([m.n_groups * m.d_state] * 2 + [m.d_inner], dim=-1)
        r = m.n_heads // m.n_groups
        q, k = (gated_delta.l2norm(y.view(s, m.n_groups, m.d_state)) for y in (q, k))
        if r > 1:
            q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
        return q * self.scale, k, v.view(s, m.n_heads, m.head_dim)

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """weight * RMSNorm(o) per head, rounded to o's dtype, times SiLU(z) in float32, then
        rounded (`Qwen3NextRMSNormGated`): [T, v_heads * value_dim]."""
        t, dtype = o.shape[0], o.dtype
        y = o.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.norm * (y.to(dtype) if self.norm_rounded else y)
        y = y * F.silu(z.float().view(t, *o.shape[1:]))
        return y.to(dtype).view(t, -1)


class Qwen3NextLayer(RecurrentLayer, GatedQuery, Qwen3Layer):
    """Gated attention or a Gated DeltaNet layer, then the MLP (`recurrent_layer.RecurrentLayer`);
    the residual adds fused into the norms, as Llama's."""

    mixer: GatedDeltaNet | None = None

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        if self.mixer is not None:
            return
        self.read_gated_qkv(model, w, prefix, ctx)  # (`qwen3.GatedQuery`)

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> GatedDeltaNet:
        c = model.config
        return GatedDeltaNet(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx)


class Qwen3NextModel(LlamaModel):
    """Qwen3-Next and Qwen3.5 (module docstring): Gemma's zero-centred norms (float32 (1 + w),
    rounded once), the experts Qwen2-MoE's."""

    layer_class = Qwen3NextLayer
    rms_norm_16bit = staticmethod(gemma_rms_norm)
    norm_weight = Gemma2Model.norm_weight
    moe_names = ("mlp.", ("gate_proj", "up_proj", "down_proj"))

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        """The MLP, or the experts beside the shared expert: per expert, or stacked (the
        published Qwen3.5-MoE checkpoints' gate_up [E, 2N, hidden] and down [E, hidden, N],
        listed with a `.weight` at load: `qwen3_next_config.STACKED`)."""
        stacked = prefix + STACKED[0] + ".weight" in w
        self.moe_names = ("mlp.", ("gate_up_proj", "down_proj") if stacked else
                          ("gate_proj", "up_proj", "down_proj"))  # fmt: skip
        return make_mlp(self, w, prefix, index, ctx)
