"""BailingHybrid (`BailingHybridForCausalLM`, Ling 3; config read in
`bailing_hybrid_config.py`): Kimi Linear's layers (`kimi_linear.py`) with

- the latent attention rotated (DeepSeek-V3's interleaved rotary) and gated per head: the
  output of each head times sigmoid(g_proj(x)) [t, heads] (rounded first) before o_proj;
- KDA layers whose forget gate is one projection, f_proj [H K, hidden], bounded (``kda_safe_gate``,
  the only form read): g = lower_bound * sigmoid(exp(A_log) (f_proj(x) + dt_bias)), rounded to
  the model's dtype as transformers does; the output gate one projection too, g_proj [H K,
  hidden]; the conv in float32 (transformers keeps its weight so), its SiLU output rounded to
  the model's dtype.

The KDA states, experts, tensor-parallel split (the KDA layers by heads, the latent attention
and its gate's rows by heads, the experts by width) and refusals are Kimi Linear's (FP8
refused).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.deepseek import DeepseekModel
from pagoda.runtime.model.delta_rule_config import conv_names
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.kimi_linear import KdaShard, KimiDeltaAttention, KimiLinearLayer
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step, linear_layer
from pagoda.runtime.model.parallel_linear import column_linear
from pagoda.runtime.recurrent_configs import MambaConfig


class BailingDeltaAttention(KimiDeltaAttention):
    """One KDA layer (module docstring): full-rank forget and output gates."""

    def __init__(self, m: MambaConfig, w: DeviceWeights, prefix: str, index: int, eps, ctx,
                 lower_bound: float):  # fmt: skip
        p = prefix + "self_attn."
        r = KdaShard(m, w, ctx)
        self.m, self.index, self.eps, self.beta_scale = r.local, index, eps, 1.0
        dev, self.lower_bound, self.dtype = w.device, lower_bound, w.dtype
        # x's projections in one matmul: q k v (the conv's channels), f, g, b
        rows = (("q_proj", r.qk), ("k_proj", r.qk), ("v_proj", r.v), ("f_proj", r.qk),
                ("g_proj", r.v), ("b_proj", r.heads))  # fmt: skip
        self.in_proj = ctx.linear(torch.cat([r.rows(f"{p}{n}.weight", s) for n, s in rows]))
        self.out_proj = r.out_proj(p + "o_proj.weight")
        # the conv in float32 (transformers keeps it so), its SiLU output rounded (`_qkv`)
        self.conv_weight = r.conv(torch.cat([w.source(n).float().to(dev)
                                             for n in conv_names(p, w)]))  # fmt: skip
        self.conv_fn = self._conv32
        self.rate = torch.exp(r.per_head(w.source(p + "A_log").float().reshape(-1, 1))).to(dev)
        dt_bias = w.source(p + "dt_bias").float().view(m.n_heads, m.head_dim)
        self.dt_bias = r.per_head(dt_bias).to(dev)  # [H, K]
        self.norm = w.source(p + "o_norm.weight").float().to(dev)
        self.scale = m.d_state**-0.5
        m = self.m
        self.sizes = [m.conv_dim, m.d_inner, m.d_inner, m.n_heads]

    def linears(self) -> list:
        return [self.in_proj, self.out_proj]

    def _conv32(self, window: torch.Tensor) -> torch.Tensor:
        """The prefill's causal conv [1, C, L] -> [1, C, L - K + 1] in float32."""
        w = self.conv_weight
        return F.conv1d(window.float(), w[:, None, :], None, groups=w.shape[0])

    def _qkv(self, x: torch.Tensor):
        """The float32 conv's SiLU output rounded to the model's dtype first, as transformers'."""
        return super()._qkv(x.to(self.dtype))

    def inputs(self, h: torch.Tensor):
        t, m = h.shape[0], self.m
        qkv, f, z, b = self.in_proj(h).split(self.sizes, dim=-1)
        beta = torch.sigmoid(b).float()
        f = f.float().view(t, m.n_heads, m.head_dim) + self.dt_bias
        g = self.lower_bound * torch.sigmoid(self.rate * f)
        return qkv, z, g.to(h.dtype).float(), beta


class BailingHybridLayer(KimiLinearLayer):
    """Kimi Linear's layer with rotary, a per-head output gate, and Bailing's KDA."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        if self.mixer is None:
            self.rope, self.interleaved = "global", True
            gate = prefix + "self_attn.g_proj.weight"  # a row per head: this rank's heads'
            self.head_gate = linear_layer(ctx, w, [gate]) if ctx.tp is None else column_linear(
                ctx, w, [gate], [ctx.tp.layout.heads(model.config.num_heads)])  # fmt: skip

    def linears(self):
        own = [] if self.mixer is not None else [self.head_gate]
        return [*super().linears(), *own]

    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        q_full, k_full, _, _ = self.project(x, step)
        k_cache, v_cache = step.kv_caches[self.index]
        out = self.ctx.backend.forward(
            q_full, k_full, k_full, k_cache, v_cache, step.meta, window=None,
            kv_scales=self.kv_scales,
        )  # fmt: skip
        # W_UV, then each head times sigmoid(g_proj(x)) rounded to the model's dtype first (as
        # transformers multiplies), o_proj
        t, h = out.shape[:2]
        v = torch.bmm(out.transpose(0, 1), self.w_uv).transpose(0, 1)  # [t, h, v_head_dim]
        v = v * torch.sigmoid(self.head_gate(x).float()).to(v.dtype).unsqueeze(-1)
        return self.o_proj(v.reshape(t, h * self.mla.v_head_dim))

    def make_mixer(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> BailingDeltaAttention:
        c = model.config
        bound = c.family.kda_lower_bound
        return BailingDeltaAttention(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx, bound)


class BailingHybridModel(DeepseekModel):
    """BailingHybrid (module docstring): DeepSeek-V3's rotary tables."""

    layer_class = BailingHybridLayer
