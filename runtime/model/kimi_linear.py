"""Kimi Linear (`KimiLinearForCausalLM`; config read in `kimi_linear_config.py`): DeepSeek-V3's
layer (`deepseek.DeepseekLayer`: latent attention, the grouped sigmoid router with its
correction bias and a shared expert) whose ``self_attn`` is, by layer, either

- latent attention with no rotary at all (the key's shared "rotary" part used as it is; the
  softmax scale qk_head_dim ** -0.5), cached as DeepSeek's latent rows; or
- Kimi Delta Attention (`KimiDeltaAttention`, transformers' `KimiLinearDeltaAttention`): q, k
  and v projections through a causal depthwise conv (SiLU; the published checkpoints' conv in
  three parts, q_conv1d, k_conv1d, v_conv1d, concatenated at load), q and k L2-normalised,
  beta = sigmoid(b_proj(x)), a log decay per key channel g = -exp(A_log[h]) softplus(
  f_b_proj(f_a_proj(x)) + dt_bias) [T, H, K], the delta rule of `kda.py` (chunked prefill in
  `gated_delta.prefill`'s packed layout, `kda.recurrent_step` for decode rows), then per head
  RMSNorm(o) * weight * sigmoid(g_b_proj(g_a_proj(x))) in float32 (`KimiLinearRMSNormGated`),
  o_proj.

The KDA layers keep a conv state [3 H K, kernel - 1] and a float32 state [H, K, K] per sequence
in the hybrids' state slots (`MambaConfig.mixer` "kda"), with prefix-caching snapshots as
Qwen3-Next's Gated DeltaNet (`qwen3_next.GatedDeltaNet`, whose step this reuses). The MLPs are
read as DeepSeek's (the published ``block_sparse_moe.`` and experts' w1, w2, w3 listed under
transformers' names at load: `kimi_linear_config.rename_mlps`). Tensor parallelism splits the
KDA layers by heads (`KimiDeltaAttention`; N must divide them: `distributed/layout.py`), the
latent attention and experts as DeepSeek's; FP8 is refused (`engine/start_checks.check_dtype`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model import kda, mamba_shard
from pagoda.runtime.model.deepseek import DeepseekLayer, DeepseekModel
from pagoda.runtime.model.delta_rule_config import conv_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.parallel_linear import row_linear
from pagoda.runtime.model.qwen3_next import GatedDeltaNet
from pagoda.runtime.model.recurrent_layer import RecurrentLayer
from pagoda.runtime.recurrent_configs import MambaConfig


class KdaShard:
    """What one rank holds of a KDA layer (`KimiDeltaAttention`): heads [r H/N, (r+1) H/N)
    (`mamba_shard.shard`; every head its own key head, n_groups = n_heads): `qk` and `v` its
    rows of the per-channel key and value projections (q, k, the forget gate's; v, the output
    gate's), `heads` its rows of the per-head ones (b, A_log, dt_bias). One rank: everything."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, ctx) -> None:
        s = mamba_shard.shard(m, None if ctx.tp is None else ctx.tp.layout)
        self.w, self.ctx, self.full, self.local = w, ctx, m, s.local
        (h0, h1), dk, dv = s.heads, m.d_state, m.head_dim
        self.heads, self.qk, self.v = s.heads, (h0 * dk, h1 * dk), (h0 * dv, h1 * dv)

    def rows(self, name: str, span: tuple[int, int] | None) -> torch.Tensor:
        """Matrix `name`: whole (one rank, or `span` None), or this rank's rows `span`."""
        if self.ctx.tp is None or span is None:
            return self.w[name]
        return self.w.part(name, 0, *span)

    def out_proj(self, name: str):
        """o_proj: whole (one rank), or row-parallel (its heads' input columns, an all-reduce)."""
        ctx = self.ctx
        return ctx.linear(self.w[name]) if ctx.tp is None else row_linear(ctx, self.w, name)

    def conv(self, conv: torch.Tensor) -> torch.Tensor:
        """The conv [q k v channels, 1, kernel] -> [C, kernel]: this rank's channels of each."""
        m, conv = self.full, conv[:, 0, :]
        if self.local is m:
            return conv.contiguous()
        kd = m.n_heads * m.d_state
        parts = ((0, self.qk), (kd, self.qk), (2 * kd, self.v))
        return torch.cat([conv[o + a : o + b] for o, (a, b) in parts]).contiguous()

    def per_head(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a per-head tensor [H, ...] (A_log, dt_bias), a copy of its own."""
        return t if self.ctx.tp is None else t[self.heads[0] : self.heads[1]].clone()


class KimiDeltaAttention(GatedDeltaNet):
    """One KDA layer (module docstring): Qwen3-Next's step with a decay per key channel. With
    tensor parallelism a rank holds heads [r H/N, (r+1) H/N) (`mamba_shard.shard`; each head
    its own key head): its rows of q, k, v, b and of f_b and g_b, its channels of the conv, its
    A, dt_bias and state slots; f_a and g_a (rank head_dim) and the norm over one head whole;
    o_proj row-parallel (one all-reduce)."""

    step_rule = staticmethod(kda.recurrent_step)
    chunk_rule = staticmethod(kda.chunked)

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, eps, ctx):
        p = prefix + "self_attn."
        r = KdaShard(m, w, ctx)
        self.m, self.index, self.eps, self.beta_scale = r.local, index, eps, 1.0
        k, dev = m.head_dim, w.device
        # x's projections in one matmul: q k v (the conv's channels), f_a, g_a (whole), b
        rows = (("q_proj", r.qk), ("k_proj", r.qk), ("v_proj", r.v), ("f_a_proj", None),
                ("g_a_proj", None), ("b_proj", r.heads))  # fmt: skip
        self.in_proj = ctx.linear(torch.cat([r.rows(f"{p}{n}.weight", s) for n, s in rows]))
        self.f_b = ctx.linear(r.rows(p + "f_b_proj.weight", r.qk))
        self.g_b = ctx.linear(r.rows(p + "g_b_proj.weight", r.v))
        self.out_proj = r.out_proj(p + "o_proj.weight")
        self.conv_weight = r.conv(torch.cat([w[n] for n in conv_names(p, w)]))
        # float32 as transformers keeps them: -exp(A_log) [H, 1], dt_bias [H, K], the norm's
        # weight (over one head: whole on every rank)
        self.A = -torch.exp(r.per_head(w.source(p + "A_log").float().reshape(-1, 1))).to(dev)
        self.dt_bias = r.per_head(w.source(p + "dt_bias").float().view(m.n_heads, k)).to(dev)
        self.norm = w.source(p + "o_norm.weight").float().to(dev)
        self.scale = m.d_state**-0.5
        self.sizes = [self.m.conv_dim, k, k, self.m.n_heads]

    def linears(self) -> list:
        return [self.in_proj, self.f_b, self.g_b, self.out_proj]

    def inputs(self, h: torch.Tensor):
        t, m = h.shape[0], self.m
        qkv, fa, ga, b = self.in_proj(h).split(self.sizes, dim=-1)
        beta = torch.sigmoid(b).float()
        f = self.f_b(fa).float().view(t, m.n_heads, m.head_dim) + self.dt_bias
        return qkv, self.g_b(ga), self.A * F.softplus(f), beta  # (softplus: x above 20)

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """weight * RMSNorm(o) * sigmoid(z) per head in float32, rounded once."""
        t, dtype = o.shape[0], o.dtype
        y = o.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.norm * y * torch.sigmoid(z.float().view(t, *o.shape[1:]))
        return y.to(dtype).view(t, -1)


class KimiLinearLayer(RecurrentLayer, DeepseekLayer):
    """DeepSeek's layer with NoPE latent attention, or KDA in its place (module docstring;
    `recurrent_layer.RecurrentLayer`)."""

    mixer: KimiDeltaAttention | None = None

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        if self.mixer is None:
            self.rope, self.interleaved = None, False  # NoPE

    def read_layer_norm(self, model: LlamaModel, w: DeviceWeights, name: str) -> torch.Tensor:
        return w[name]  # as stored, as DeepSeek's layer reads its norms

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> KimiDeltaAttention:
        c = model.config
        return KimiDeltaAttention(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx)


class KimiLinearModel(DeepseekModel):
    """Kimi Linear (module docstring): no rotary tables."""

    layer_class = KimiLinearLayer

    def build_rope_caches(self, max_positions: int) -> dict[str, torch.Tensor]:
        return {}
